-- Dead: move the leased row to pgwake.dead_jobs, fenced by (id, attempt).
WITH mine AS (
    DELETE FROM pgwake.leased_jobs WHERE id = $1 AND attempts = $2 RETURNING *
)
INSERT INTO pgwake.dead_jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, $3, created_at
FROM mine
ON CONFLICT (id) DO UPDATE SET
    attempts = excluded.attempts, last_error = excluded.last_error, failed_at = now()
RETURNING id
