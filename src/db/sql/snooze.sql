-- Put snoozed tx-mode jobs back into the queue under their own ids, inside
-- the claim transaction (as requeue.sql, whose parameters these are), and
-- count the snooze (pgwake.job_snoozes, migration 0034) in the same
-- statement. $8 attempts is the claim's attempt given back: a snooze uses
-- none. last_error is kept.
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
INSERT INTO pgwake.job_snoozes AS s (job_id, snoozes, snoozed_until, snoozed_at)
SELECT id, 1, run_at, now() FROM back
ON CONFLICT (job_id) DO UPDATE
    SET snoozes = s.snoozes + 1, snoozed_until = excluded.snoozed_until,
        snoozed_at = excluded.snoozed_at
