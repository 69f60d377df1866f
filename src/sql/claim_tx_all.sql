-- tx-mode claim over every queue but the lease-mode ones ($2). Runs inside the claim transaction: the
-- rows stay locked (deleted, uncommitted) while their handlers run, and come
-- back by themselves if the worker dies. `= ANY(ARRAY(...))` evaluates the
-- locking subquery exactly once.
DELETE FROM pgwake.jobs
WHERE id = ANY(ARRAY(
    SELECT id FROM pgwake.jobs
    WHERE run_at <= now() AND queue <> ALL($2::text[])
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED))
RETURNING id, queue, task, payload::text, priority, run_at, attempts, max_attempts,
          last_error, created_at,
          extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8
