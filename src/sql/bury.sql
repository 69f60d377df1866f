-- Move tx-mode jobs to the dead-letter table, inside the claim transaction
-- (out of attempts, failed permanently, no handler, undecodable payload).
INSERT INTO pgwake.dead_jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
     created_at, timeout)
SELECT id, queue, task, payload::jsonb, priority, run_at, attempts, max_attempts, last_error,
       created_at, make_interval(secs => timeout)
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[],
            $6::timestamptz[], $7::int[], $8::int[], $9::text[], $10::timestamptz[],
            $11::float8[])
    AS j(id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout)
ON CONFLICT (id) DO UPDATE SET
    queue = excluded.queue, task = excluded.task, payload = excluded.payload,
    priority = excluded.priority, run_at = excluded.run_at, attempts = excluded.attempts,
    max_attempts = excluded.max_attempts, last_error = excluded.last_error,
    created_at = excluded.created_at, timeout = excluded.timeout, failed_at = now()
