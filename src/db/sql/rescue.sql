-- Move expired leases back: to pgwake.jobs (ready now; the insert trigger
-- wakes every listening worker) or, when that was the last attempt or the
-- job's cancel was requested (pgwake.cancel_requests: its worker died
-- before it could stop it), to pgwake.dead_jobs. SKIP LOCKED + DELETE: two
-- rescuers running at once requeue each job exactly once. $1: most rows per
-- run.
WITH expired AS (
    DELETE FROM pgwake.leased_jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgwake.leased_jobs
        WHERE lease_until < now()
        ORDER BY lease_until
        LIMIT $1
        FOR UPDATE SKIP LOCKED))
    RETURNING *, EXISTS (SELECT 1 FROM pgwake.cancel_requests r
                         WHERE r.job_id = pgwake.leased_jobs.id) AS cancelled
),
requeued AS (
    INSERT INTO pgwake.jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at,
         timeout, ordering_key, unique_key, ordering_at)
    SELECT id, queue, task, payload, priority, now(), attempts, max_attempts,
           format('lease expired on attempt %s (worker %s stopped heartbeating)', attempts, worker_id),
           created_at, timeout, ordering_key,
           -- a job enqueued with this unique key meanwhile keeps the key, even
           -- one a producer has not committed yet: never waits (functions/keys.sql)
           pgwake.requeued_unique_key(unique_key),
           coalesce(ordering_at, run_at)
    FROM expired WHERE attempts < max_attempts AND NOT cancelled
    RETURNING queue
),
buried AS (
    INSERT INTO pgwake.dead_jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at,
         timeout, worker_id, started_at, ordering_key, unique_key, ordering_at)
    SELECT id, queue, task, payload, priority, run_at, least(attempts, max_attempts), max_attempts,
           CASE WHEN cancelled THEN 'cancelled'
                ELSE format('lease expired on the last attempt (%s of %s; worker %s stopped heartbeating)',
                            attempts, max_attempts, worker_id)
           END,
           created_at, timeout, worker_id, leased_at, ordering_key, unique_key, ordering_at
    FROM expired WHERE attempts >= max_attempts OR cancelled
    ON CONFLICT (id) DO UPDATE SET
        queue = excluded.queue, task = excluded.task, payload = excluded.payload,
        priority = excluded.priority, run_at = excluded.run_at, attempts = excluded.attempts,
        max_attempts = excluded.max_attempts, last_error = excluded.last_error,
        created_at = excluded.created_at, timeout = excluded.timeout,
        worker_id = excluded.worker_id, started_at = excluded.started_at,
        ordering_key = excluded.ordering_key, unique_key = excluded.unique_key,
        ordering_at = excluded.ordering_at, failed_at = now()
    RETURNING queue
)
SELECT queue, 'requeued' AS what FROM requeued
UNION ALL
SELECT queue, 'dead' FROM buried
