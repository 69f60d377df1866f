-- lease-mode claim: move ready jobs of one lease queue ($1) into
-- pgwake.leased_jobs in one statement, counting the attempt, and commit at
-- once (autocommit). $2: limit, $3: worker id, $4: lease seconds.
WITH claimed AS (
    DELETE FROM pgwake.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgwake.jobs
        WHERE queue = $1 AND run_at <= now()
        ORDER BY priority, run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED))
    RETURNING *
)
INSERT INTO pgwake.leased_jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
     created_at, worker_id, leased_at, lease_until)
SELECT id, queue, task, payload, priority, run_at, attempts + 1, max_attempts, last_error,
       created_at, $3, now(), now() + make_interval(secs => $4)
FROM claimed
RETURNING id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
          created_at,
          extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8
