-- Lease-mode jobs to dead_jobs, fenced by claim token. $1 tokens, $2
-- last_error. Returns the tokens that matched. With history on, the
-- trigger on dead_jobs records them (migration 0006).
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS u(token, last_error)
),
mine AS (
    DELETE FROM pgwake.leased_jobs l USING u WHERE l.token = u.token
    RETURNING l.*, u.last_error AS new_error
),
buried AS (
    INSERT INTO pgwake.dead_jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, started_at, ordering_key, unique_key, ordering_at,
         limit_key)
    SELECT id, queue, task, payload, priority, run_at, least(attempts, max_attempts), max_attempts, new_error,
           created_at, timeout, worker_id, leased_at, ordering_key, unique_key, ordering_at,
           limit_key
    FROM mine
    ON CONFLICT (id) DO UPDATE SET
        queue = excluded.queue, task = excluded.task, payload = excluded.payload,
        priority = excluded.priority, run_at = excluded.run_at, attempts = excluded.attempts,
        max_attempts = excluded.max_attempts, last_error = excluded.last_error,
        created_at = excluded.created_at, timeout = excluded.timeout,
        worker_id = excluded.worker_id, started_at = excluded.started_at,
        ordering_key = excluded.ordering_key, unique_key = excluded.unique_key,
        ordering_at = excluded.ordering_at, limit_key = excluded.limit_key, failed_at = now()
)
SELECT token FROM mine
