-- Jobs in every state, filtered, ids above $7, at most $8, since $9
-- (functions/jobs.sql).
SELECT id, job_state, job_queue, job_task, priority, attempts, max_attempts, run_at,
       created_at, job_ordering_key, job_unique_key, worker, last_error, job_limit_key
FROM pgwake.list_jobs($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9)
