-- pgwake schema, version 19: every attempt's error. A failed attempt's
-- error used to live only as `last_error`, overwritten by the next failure;
-- now each is kept here, one row per (job, attempt), written by triggers on
-- the rows that carry it (functions/jobs.sql: a job put back in
-- `pgwake.jobs` after a failure or a rescue, a job moved to
-- `pgwake.dead_jobs`), so every path records it in both delivery modes.
-- Read by `pgwake job show` and the console's job page; rows older than
-- seven days are deleted by the workers' rescuer.
CREATE TABLE pgwake.job_errors (
    job_id  bigint      NOT NULL,
    attempt integer     NOT NULL,
    error   text        NOT NULL,
    at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job_id, attempt)
);
CREATE INDEX job_errors_at_idx ON pgwake.job_errors (at);
