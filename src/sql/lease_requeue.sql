-- Failed attempt (or handed back at shutdown): move the leased row back to
-- pgwake.jobs, fenced by (id, attempt). $3: attempts to record, $4:
-- last_error, $5: delay in seconds (NULL keeps the original run_at).
WITH mine AS (
    DELETE FROM pgwake.leased_jobs WHERE id = $1 AND attempts = $2 RETURNING *
)
INSERT INTO pgwake.jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
SELECT id, queue, task, payload, priority,
       coalesce(clock_timestamp() + make_interval(secs => $5::float8), run_at),
       $3, max_attempts, $4, created_at
FROM mine
RETURNING run_at
