-- Lease-mode jobs back to the queue, fenced by claim token: failed attempts
-- (attempts counted, last_error, a backoff run_at) and runs handed back at
-- shutdown (attempt refunded, run_at kept: $4 NULL). $1 tokens, $2 attempts
-- to record, $3 last_error, $4 delay seconds. Returns the tokens that
-- matched.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::int[], $3::text[], $4::float8[])
        AS u(token, attempts, last_error, delay)
),
mine AS (
    DELETE FROM pgwake.leased_jobs l USING u WHERE l.token = u.token
    RETURNING l.*, u.attempts AS new_attempts, u.last_error AS new_error, u.delay
),
back AS (
    INSERT INTO pgwake.jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, ordering_key, unique_key, ordering_at, limit_key, suspect)
    SELECT id, queue, task, payload, priority,
           coalesce(clock_timestamp() + make_interval(secs => delay), run_at),
           new_attempts, max_attempts, new_error, created_at, timeout, ordering_key,
           -- a job enqueued with this unique key meanwhile keeps the key, even
           -- one a producer has not committed yet: never waits (functions/keys.sql)
           pgwake.requeued_unique_key(unique_key),
           -- its place in its ordering key, whatever its new run_at
           coalesce(ordering_at, run_at), limit_key,
           -- a suspect handed back stays one; a run that ended is none
           delay IS NULL AND suspect
    FROM mine
)
SELECT token FROM mine
