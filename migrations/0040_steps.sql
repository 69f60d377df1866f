-- pgwake schema, version 40: durable steps (issue 37, item 3).
-- A handler's `JobContext::step(name, future)` records the output of each
-- step it finishes; when the job runs again (a retry, a crash, a lost
-- lease, a deploy) a recorded step returns its stored output without
-- running. Number 39 is another branch's.
--
--   job_id       the job (a job keeps its id through every move)
--   name         the step's name (1-100 characters of [A-Za-z0-9_.:-],
--                checked by the worker and here)
--   output       its output as JSON (at most 64 KiB, checked by the worker)
--   attempt      the attempt that recorded it
--   recorded_at  when
--
-- Beside the job, by id, as pgwake.job_traces (migration 0038): no claim,
-- requeue or bury statement carries them, and a job that uses no steps
-- costs nothing. Lease mode writes a row on the worker's pool, fenced by
-- the run's lease token, before the step returns; tx mode writes it
-- through the claim transaction, so it commits with the step's effects
-- (and a failed attempt keeps the steps it finished: docs/src/steps.md).
-- Rows of jobs that are gone (done without history, purged, aged out of
-- the history) are deleted by pgwake.sweep_job_steps in the history
-- maintenance (functions/steps.sql).
CREATE TABLE IF NOT EXISTS pgwake.job_steps (
    job_id      bigint      NOT NULL,
    name        text        NOT NULL CONSTRAINT job_steps_name_valid
                                CHECK (name ~ '^[A-Za-z0-9_.:-]{1,100}$'),
    output      jsonb       NOT NULL,
    attempt     integer     NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, name)
);
