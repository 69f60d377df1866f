-- Sleeping lease-mode jobs back to the queue, fenced by claim token (as
-- lease_snooze.sql), with the attempt the claim counted given back and
-- last_error kept, due at their wake time; the sleep is recorded
-- (pgwake.job_waits, migration 0041) in the same statement, only for the
-- tokens that matched. $1 tokens, $2 attempts to record (the claim's given
-- back), $3 delay seconds to the wake time. Returns the tokens that matched.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::float8[]) AS u(token, attempts, delay)
),
mine AS (
    DELETE FROM pgwake.leased_jobs l USING u WHERE l.token = u.token
    RETURNING l.*, u.attempts AS new_attempts, u.delay
),
back AS (
    INSERT INTO pgwake.jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, ordering_key, unique_key, ordering_at, limit_key, suspect)
    SELECT id, queue, task, payload, priority,
           clock_timestamp() + make_interval(secs => delay),
           new_attempts, max_attempts, last_error, created_at, timeout,
           ordering_key,
           -- as lease_requeue.sql: a job enqueued with this key meanwhile keeps it
           pgwake.requeued_unique_key(unique_key),
           coalesce(ordering_at, run_at), limit_key, false
    FROM mine
    RETURNING id, run_at
),
counted AS (
    INSERT INTO pgwake.job_waits AS w (job_id, kind, wait_until, waited_at, waits)
    SELECT id, 'sleep', run_at, now(), 1 FROM back
    ON CONFLICT (job_id) DO UPDATE
        SET kind = excluded.kind, wait_until = excluded.wait_until,
            waited_at = excluded.waited_at, waits = w.waits + 1
)
SELECT token FROM mine
