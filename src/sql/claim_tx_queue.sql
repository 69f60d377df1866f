-- tx-mode claim from one queue ($2), in claim order on jobs_queue_claim_idx.
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks.
--
-- Runs inside the claim transaction: the rows stay deleted-but-uncommitted
-- (locked) while their handlers run and come back by themselves if the
-- worker dies. `= ANY(ARRAY(...))` evaluates the locking subquery once.
-- Returns the claim columns (context.rs), the claim transaction's xid (for
-- the batch marker) and its server process (to cancel a timed-out
-- handler's statement). Which claimed jobs are suspects is asked by the next
-- statement (suspects.sql), whose snapshot is taken after these rows are
-- locked.
WITH c AS (
    DELETE FROM pgwake.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgwake.jobs
        WHERE queue = $2::text AND run_at <= now()
          -- Paused or limited (a limited queue is claimed by
          -- claim_*_limited.sql): a one-time filter (migration 0011).
          AND pgwake.queue_claimable($2::text)
          AND ($3::text[] IS NULL OR task = ANY($3::text[])) AND task <> ALL($4::text[])
          -- CASE, not `ordering_key IS NULL OR …`, which the planner rates at
          -- 0.5% without statistics (ARCHITECTURE.md, "The claim predicate").
          AND CASE WHEN ordering_key IS NULL THEN true
                   ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
        ORDER BY priority, run_at, id
        -- `(SELECT $1::int8)`, not `$1`: hidden from the planner, which could
        -- otherwise read and sort the whole queue after a burst into a table
        -- analyzed empty (ARCHITECTURE.md, "The limit is hidden from the planner").
        LIMIT (SELECT $1::int8)
        FOR UPDATE SKIP LOCKED))
    RETURNING *
)
SELECT id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
       created_at, extract(epoch FROM timeout)::float8,
       extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8,
       pg_current_xact_id()::text,
       pg_backend_pid(),
       ordering_key, unique_key, coalesce(ordering_at, run_at)
FROM c
