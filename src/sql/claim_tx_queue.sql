-- tx-mode claim from one of the worker's queues ($2), in claim order on
-- jobs_queue_claim_idx. Runs inside the claim transaction: the
-- rows stay locked (deleted, uncommitted) while their handlers run, and come
-- back by themselves if the worker dies. `= ANY(ARRAY(...))` evaluates the
-- locking subquery exactly once.
DELETE FROM pgwake.jobs
WHERE id = ANY(ARRAY(
    SELECT id FROM pgwake.jobs
    WHERE queue = $2 AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED))
RETURNING id, queue, task, payload::text, priority, run_at, attempts, max_attempts,
          last_error, created_at,
          extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8
