-- Snoozed lease-mode jobs back to the queue, fenced by claim token (as
-- lease_requeue.sql), with the attempt the claim counted given back and
-- last_error kept, due after the snooze; the snooze is counted
-- (pgwake.job_snoozes, migration 0034) in the same statement, only for the
-- tokens that matched. $1 tokens, $2 attempts to record (the claim's given
-- back), $3 delay seconds. Returns the tokens that matched.
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
    INSERT INTO pgwake.job_snoozes AS s (job_id, snoozes, snoozed_until, snoozed_at)
    SELECT id, 1, run_at, now() FROM back
    ON CONFLICT (job_id) DO UPDATE
        SET snoozes = s.snoozes + 1, snoozed_until = excluded.snoozed_until,
            snoozed_at = excluded.snoozed_at
)
SELECT token FROM mine
