-- Lease-mode jobs that wait for a signal back to the queue, fenced by claim
-- token (as lease_sleep.sql), with the attempt the claim counted given
-- back and last_error kept, due at their timeout; the wait is recorded
-- (pgwake.job_waits, kind 'signal', migration 0042) in the same statement,
-- only for the tokens that matched. $1 tokens, $2 attempts to record, $3
-- delay seconds to the timeout, $4 the keys. The worker then calls
-- pgwake.take_kept_signals with the keys (signal_take.sql). Returns the
-- tokens that matched.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::float8[], $4::text[])
        AS u(token, attempts, delay, signal_key)
),
mine AS (
    DELETE FROM pgwake.leased_jobs l USING u WHERE l.token = u.token
    RETURNING l.*, u.attempts AS new_attempts, u.delay, u.signal_key
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
    INSERT INTO pgwake.job_waits AS w
        (job_id, kind, wait_until, waited_at, waits, signal_key, signal_state, signal_payload,
         signalled_at)
    SELECT back.id, 'signal', back.run_at, now(), 1, mine.signal_key, 'waiting', NULL, NULL
    FROM back JOIN mine ON mine.id = back.id
    ON CONFLICT (job_id) DO UPDATE
        SET kind = excluded.kind, wait_until = excluded.wait_until,
            waited_at = excluded.waited_at, waits = w.waits + 1,
            signal_key = excluded.signal_key, signal_state = 'waiting',
            signal_payload = NULL, signalled_at = NULL
)
SELECT token FROM mine
