-- Put jobs back into the queue under their own ids: failed attempts (with
-- attempts + 1, last_error and a backoff run_at) and jobs handed back
-- unstarted at shutdown (unchanged). The insert trigger wakes other workers
-- for those that are ready now. Payloads travel as the JSON text the claim
-- returned, untouched (even one the worker could not decode).
INSERT INTO pgwake.jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
SELECT id, queue, task, payload::jsonb, priority,
       coalesce(clock_timestamp() + make_interval(secs => delay), run_at),
       attempts, max_attempts, last_error, created_at
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::float8[], $8::int[], $9::int[], $10::text[], $11::timestamptz[])
    AS j(id, queue, task, payload, priority, run_at, delay, attempts, max_attempts, last_error, created_at)
RETURNING id, run_at
