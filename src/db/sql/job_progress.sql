-- The progress of the running jobs among $1 that reported some in their
-- current run (pgwake.job_progress_of, functions/jobs.sql): job id, value
-- (JSON text), message, when written.
SELECT job_id, value, message, updated_at FROM pgwake.job_progress_of($1::bigint[])
