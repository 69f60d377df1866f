-- Put tx-mode jobs back into the queue under their own ids, inside the
-- claim transaction: failed attempts (attempts counted, last_error, a
-- backoff run_at) and jobs handed back unstarted (unchanged). The insert
-- trigger wakes other workers for those that are ready now. Payloads travel
-- as the JSON text the claim returned, untouched.
INSERT INTO pgwake.jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
     created_at, timeout)
SELECT id, queue, task, payload::jsonb, priority,
       coalesce(clock_timestamp() + make_interval(secs => delay), run_at),
       attempts, max_attempts, last_error, created_at, make_interval(secs => timeout)
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::float8[], $8::int[], $9::int[], $10::text[], $11::timestamptz[], $12::float8[])
    AS j(id, queue, task, payload, priority, run_at, delay, attempts, max_attempts, last_error,
         created_at, timeout)
