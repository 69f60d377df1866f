-- pgwake schema, version 37: progress (issue 37, item 2).
-- A running job reports a small JSON value and an optional message
-- (`JobContext::progress`, exec's `pgwake-progress:` stderr line, a
-- persistent handler's `progress` message). The worker keeps the latest
-- value of each job in memory and writes those that changed every
-- `--progress-interval`, one statement for all of them
-- (src/db/sql/progress_flush.sql): never a round trip per report.
--
--   job_id      the job
--   token       the run's claim token (lease mode; pgwake.leased_jobs.token)
--   xid         the run's claim transaction (tx mode)
--   value       the value last reported (bounded by the worker: 4 KiB, depth 8)
--   message     its message, if any (at most 200 characters)
--   updated_at  when it was written
--
-- A row belongs to one run: exactly one of token and xid says which. A
-- write is fenced by it (pgwake.progress_current, functions/progress.sql):
-- a lease run writes only while its token holds the lease, a tx run only
-- while its claim transaction is open; a stale run cannot overwrite the
-- row of a newer one. Readers (`pgwake explain`, `pgwake job show`, the
-- console) show a row only while its run is current, so the progress of
-- a run that died is never shown as the progress of the run after it.
--
-- Not a column of pgwake.jobs: a tx-mode job's row is locked (deleted) by
-- its claim transaction while it runs, and anything written there would
-- be invisible until its commit. The worker deletes a run's row when the
-- run ends; the rescuer's round deletes the rows of runs that are over
-- (a worker killed mid-job), so a row goes with its job.
--
-- Cost: a new, empty table; jobs that never report progress never touch it.
-- Number 36 is another branch's.

CREATE TABLE IF NOT EXISTS pgwake.job_progress (
    job_id     bigint      PRIMARY KEY,
    token      bigint,
    xid        xid8,
    value      jsonb       NOT NULL,
    message    text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT job_progress_one_run CHECK ((token IS NULL) <> (xid IS NULL))
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000
);
