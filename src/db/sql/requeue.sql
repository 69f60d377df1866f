-- Put tx-mode jobs back into the queue under their own ids, inside the
-- claim transaction: failed attempts (attempts counted, last_error, a
-- backoff run_at) and jobs handed back unstarted (unchanged). The insert
-- trigger wakes other workers for those that are ready now. Payloads travel
-- as the JSON text the claim returned, untouched. $13–$15: the keys and
-- the ordering position (the claim's coalesce(ordering_at, run_at)), so a
-- retried job keeps its place in its ordering key. No unique_key conflict
-- can arise: a producer's INSERT of the same key waits for this transaction.
INSERT INTO pgwake.jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
     created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
SELECT id, queue, task, payload::jsonb, priority,
       coalesce(clock_timestamp() + make_interval(secs => delay), run_at),
       attempts, max_attempts, last_error, created_at, make_interval(secs => timeout),
       ordering_key, unique_key, ordering_at, limit_key
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::float8[], $8::int[], $9::int[], $10::text[], $11::timestamptz[], $12::float8[],
            $13::text[], $14::text[], $15::timestamptz[], $16::text[])
    AS j(id, queue, task, payload, priority, run_at, delay, attempts, max_attempts, last_error,
         created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
