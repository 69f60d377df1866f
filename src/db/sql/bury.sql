-- Move tx-mode jobs to the dead-letter table, inside the claim transaction
-- (out of attempts, failed permanently, no handler, undecodable payload).
-- $12: this worker's id; $13–$15: keys and ordering position; the run was claimed at this transaction's start.
-- With history on, the trigger on dead_jobs records them (migration 0006).
INSERT INTO pgwake.dead_jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
     created_at, timeout, worker_id, started_at, ordering_key, unique_key, ordering_at,
     limit_key)
SELECT id, queue, task, payload::jsonb, priority, run_at, attempts, max_attempts, last_error,
       created_at, make_interval(secs => timeout), $12::text, now(), ordering_key, unique_key,
       ordering_at, limit_key
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[],
            $6::timestamptz[], $7::int[], $8::int[], $9::text[], $10::timestamptz[],
            $11::float8[], $13::text[], $14::text[], $15::timestamptz[], $16::text[])
    AS j(id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
ON CONFLICT (id) DO UPDATE SET
    queue = excluded.queue, task = excluded.task, payload = excluded.payload,
    priority = excluded.priority, run_at = excluded.run_at, attempts = excluded.attempts,
    max_attempts = excluded.max_attempts, last_error = excluded.last_error,
    created_at = excluded.created_at, timeout = excluded.timeout,
    worker_id = excluded.worker_id, started_at = excluded.started_at,
    ordering_key = excluded.ordering_key, unique_key = excluded.unique_key,
    ordering_at = excluded.ordering_at, limit_key = excluded.limit_key, failed_at = now()
