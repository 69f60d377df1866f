-- lease-mode claim from one queue ($2), in claim order on jobs_queue_claim_idx.
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks,
-- $5: worker id, $6: lease seconds.
--
-- Moves the jobs into pgwake.leased_jobs in one autocommit statement, with
-- this attempt counted and a fresh claim token (never reused: every later
-- write of this run is fenced by it).
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
INSERT INTO pgwake.leased_jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
     created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
     ordering_at, holds_slot)
SELECT id, queue, task, payload, priority, run_at, attempts + 1, max_attempts, last_error,
       created_at, timeout, $5, now(), now() + make_interval(secs => $6), ordering_key,
       unique_key, ordering_at, false
FROM c
RETURNING id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
          created_at, extract(epoch FROM timeout)::float8,
          extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8,
          token,
          ordering_key, unique_key, coalesce(ordering_at, run_at)
