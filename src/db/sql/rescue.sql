-- Move expired leases back to the queue or to dead_jobs, row by row
-- (functions/rescue.sql). $1: most rows per run. One row per lease: queue,
-- what (requeued, refunded: a buffered lease back with its attempt
-- refunded, dead, failed), job id, error.
SELECT queue, what, job_id, error FROM pgwake.rescue($1::int8)
