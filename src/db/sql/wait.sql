-- Put tx-mode jobs that wait for a signal back into the queue under their
-- own ids, due at their timeout, inside the claim transaction (as
-- sleep.sql, whose parameters these are: $7 is the delay to the timeout),
-- and record the wait (pgwake.job_waits, kind 'signal', migration 0042) in
-- the same statement; $17 the keys. The worker then calls
-- pgwake.take_kept_signals with the keys in the same transaction
-- (signal_take.sql). $8 attempts is the claim's attempt given back.
WITH j AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[],
                         $6::timestamptz[], $7::float8[], $8::int[], $9::int[], $10::text[],
                         $11::timestamptz[], $12::float8[], $13::text[], $14::text[],
                         $15::timestamptz[], $16::text[], $17::text[])
        AS j(id, queue, task, payload, priority, run_at, delay, attempts, max_attempts, last_error,
             created_at, timeout, ordering_key, unique_key, ordering_at, limit_key, signal_key)
),
back AS (
    INSERT INTO pgwake.jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
    SELECT id, queue, task, payload::jsonb, priority,
           clock_timestamp() + make_interval(secs => delay),
           attempts, max_attempts, last_error, created_at, make_interval(secs => timeout),
           ordering_key, unique_key, ordering_at, limit_key
    FROM j
    RETURNING id, run_at
)
INSERT INTO pgwake.job_waits AS w
    (job_id, kind, wait_until, waited_at, waits, signal_key, signal_state, signal_payload,
     signalled_at)
SELECT back.id, 'signal', back.run_at, now(), 1, j.signal_key, 'waiting', NULL, NULL
FROM back JOIN j ON j.id = back.id
ON CONFLICT (job_id) DO UPDATE
    SET kind = excluded.kind, wait_until = excluded.wait_until,
        waited_at = excluded.waited_at, waits = w.waits + 1,
        signal_key = excluded.signal_key, signal_state = 'waiting',
        signal_payload = NULL, signalled_at = NULL
