-- Put sleeping tx-mode jobs back into the queue under their own ids, due
-- at their wake time, inside the claim transaction (as snooze.sql, whose
-- parameters these are: $7 is the delay to the wake time), and record the
-- sleep (pgwake.job_waits, migration 0041) in the same statement. $8
-- attempts is the claim's attempt given back: a sleep uses none.
-- last_error is kept.
WITH back AS (
    INSERT INTO pgwake.jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
    SELECT id, queue, task, payload::jsonb, priority,
           clock_timestamp() + make_interval(secs => delay),
           attempts, max_attempts, last_error, created_at, make_interval(secs => timeout),
           ordering_key, unique_key, ordering_at, limit_key
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
                $7::float8[], $8::int[], $9::int[], $10::text[], $11::timestamptz[], $12::float8[],
                $13::text[], $14::text[], $15::timestamptz[], $16::text[])
        AS j(id, queue, task, payload, priority, run_at, delay, attempts, max_attempts, last_error,
             created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
    RETURNING id, run_at
)
INSERT INTO pgwake.job_waits AS w (job_id, kind, wait_until, waited_at, waits)
SELECT id, 'sleep', run_at, now(), 1 FROM back
ON CONFLICT (job_id) DO UPDATE
    SET kind = excluded.kind, wait_until = excluded.wait_until,
        waited_at = excluded.waited_at, waits = w.waits + 1
