-- pgwake schema, version 12: the four plain claims (every claim but those
-- of limited queues and the one-job claim) run in PL/pgSQL functions that
-- plan their query once per session instead of on every claim.
--
-- Why. The claims were prepared statements with custom plans: PostgreSQL
-- planned the claim (a DELETE of a locking subquery, the INSERT of a lease,
-- the pause/limit filter, the ordered-keys test) on every execution. For a
-- claim of one job that planning was 0.14-0.18 ms of about 0.35 ms of server
-- time (pg_stat_statements; pgbench on 20,000 jobs: 0.35 against 0.25 ms
-- per one-job lease claim, 0.66 against 0.25 ms through the unnamed
-- statements the worker sends behind PgBouncer, planned on every call).
--
-- A plan made once must be right whatever the table held when it was made:
-- the first claim of a worker often runs on an empty table analyzed empty,
-- where every plan costs about nothing. So the functions leave the planner
-- no wrong choice (ARCHITECTURE.md → "Claims plan once"):
--   * `enable_sort = off`, `enable_seqscan = off`: the only plans that
--     return jobs in claim order without a sort walk a claim index. Without
--     them the generic plan reads the whole queue and sorts it (the planner
--     cannot estimate `queue <> ALL($2)` without the argument and rates the
--     ready jobs at a handful: 26 ms per claim at 20,000 jobs).
--   * The one-queue claims order by (queue, priority, run_at, id) and say
--     `queue >= q AND queue <= q`: only jobs_queue_claim_idx has that order
--     (an equality would make `queue` a constant of the order, and on an
--     empty table jobs_claim_idx, which then reads every other queue's jobs
--     too, would cost the same).
--   * The DELETE removes the rows the subquery locked by their address
--     (`ctid`, a TID scan), not by `id = ANY(…)`, which every index ending
--     in `id` can answer and which a plan made on an empty table answered
--     by walking all of jobs_queue_claim_idx (0.3× throughput).
--   * `jit = off`: a disabled plan type costs 1e10, which would make the
--     plan look expensive enough to compile on every call (390 ms).
--   * `plan_cache_mode = force_generic_plan`: the plan is made at the first
--     call of a session and kept until the table's statistics change.
-- These settings hold only inside the call (SET clauses of the function).
-- tests/plans.rs checks the plan each function runs, made on an empty table
-- and after a burst into two queues.
--
-- The queries are those of src/sql/claim_{tx,lease}_{all,queue}.sql at
-- version 11, column for column; those files now call these functions.
-- `#variable_conflict use_column`: a name that is both a column and an
-- output column of the function (`id`, `queue`, …) means the column.

-- tx-mode claim over every queue but `skip_queues` (claimed by other specs
-- of the worker). Runs inside the claim transaction: the rows stay
-- deleted-but-uncommitted (locked) while their handlers run and come back
-- by themselves if the worker dies. Returns the claim columns, the claim
-- transaction's xid (for the batch marker) and its server process (to
-- cancel a timed-out handler's statement).
CREATE FUNCTION pgwake.claim_tx_all(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               xid text, backend_pid integer,
               ordering_key text, unique_key text, ordering_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        -- By address: the subquery locked each row it returns, so no other
        -- transaction can update or delete it before this one ends (pgwake
        -- never updates a waiting job), and VACUUM never moves a live row.
        -- A row that someone's UPDATE changed after this statement's
        -- snapshot was taken comes back locked at its new address, which the
        -- snapshot does not see: it is not claimed now, and stays for a
        -- later claim (this transaction's lock on it ends with it).
        DELETE FROM pgwake.jobs
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM pgwake.jobs
            WHERE run_at <= now() AND queue <> ALL(skip_queues)
              -- Paused and limited queues (limited ones are claimed by
              -- claim_*_limited.sql): one scan of pgwake.queues into a hash.
              AND queue NOT IN (SELECT name FROM pgwake.queues
                                WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL)
              AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
              -- CASE, not `ordering_key IS NULL OR …`: the function runs
              -- only for keyed jobs (ARCHITECTURE.md, "The claim predicate").
              AND CASE WHEN ordering_key IS NULL THEN true
                       ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
            ORDER BY priority, run_at, id
            LIMIT claim_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING *
    )
    SELECT c.id, c.queue, c.task, c.payload::text, c.priority, c.run_at, c.attempts,
           c.max_attempts, c.last_error, c.created_at, extract(epoch FROM c.timeout)::float8,
           extract(epoch FROM clock_timestamp() - greatest(c.created_at, c.run_at))::float8,
           pg_current_xact_id()::text,
           pg_backend_pid(),
           c.ordering_key, c.unique_key, coalesce(c.ordering_at, c.run_at)
    FROM c;
END
$$;

-- tx-mode claim from one queue, in claim order on jobs_queue_claim_idx.
CREATE FUNCTION pgwake.claim_tx_queue(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               xid text, backend_pid integer,
               ordering_key text, unique_key text, ordering_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        DELETE FROM pgwake.jobs
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM pgwake.jobs
            WHERE queue >= claim_queue AND queue <= claim_queue AND run_at <= now()
              -- Paused or limited: a one-time filter (migration 0011).
              AND pgwake.queue_claimable(claim_queue)
              AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
              AND CASE WHEN ordering_key IS NULL THEN true
                       ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
            ORDER BY queue, priority, run_at, id
            LIMIT claim_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING *
    )
    SELECT c.id, c.queue, c.task, c.payload::text, c.priority, c.run_at, c.attempts,
           c.max_attempts, c.last_error, c.created_at, extract(epoch FROM c.timeout)::float8,
           extract(epoch FROM clock_timestamp() - greatest(c.created_at, c.run_at))::float8,
           pg_current_xact_id()::text,
           pg_backend_pid(),
           c.ordering_key, c.unique_key, coalesce(c.ordering_at, c.run_at)
    FROM c;
END
$$;

-- lease-mode claim over every queue but `skip_queues`. Moves the jobs into
-- pgwake.leased_jobs in one statement, with this attempt counted and a
-- fresh claim token (never reused: every later write of this run is fenced
-- by it). `holds_slot` false: these queues have no max_running limit
-- (migration 0011).
CREATE FUNCTION pgwake.claim_lease_all(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        DELETE FROM pgwake.jobs
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM pgwake.jobs
            WHERE run_at <= now() AND queue <> ALL(skip_queues)
              AND queue NOT IN (SELECT name FROM pgwake.queues
                                WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL)
              AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
              AND CASE WHEN ordering_key IS NULL THEN true
                       ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
            ORDER BY priority, run_at, id
            LIMIT claim_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING *
    )
    INSERT INTO pgwake.leased_jobs AS l
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
         ordering_at, holds_slot)
    SELECT c.id, c.queue, c.task, c.payload, c.priority, c.run_at, c.attempts + 1,
           c.max_attempts, c.last_error, c.created_at, c.timeout, worker, now(),
           now() + make_interval(secs => lease_seconds), c.ordering_key, c.unique_key,
           c.ordering_at, false
    FROM c
    RETURNING l.id, l.queue, l.task, l.payload::text, l.priority, l.run_at, l.attempts,
              l.max_attempts, l.last_error, l.created_at, extract(epoch FROM l.timeout)::float8,
              extract(epoch FROM clock_timestamp() - greatest(l.created_at, l.run_at))::float8,
              l.token, l.ordering_key, l.unique_key, coalesce(l.ordering_at, l.run_at);
END
$$;

-- lease-mode claim from one queue, in claim order on jobs_queue_claim_idx.
CREATE FUNCTION pgwake.claim_lease_queue(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH c AS (
        DELETE FROM pgwake.jobs
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM pgwake.jobs
            WHERE queue >= claim_queue AND queue <= claim_queue AND run_at <= now()
              AND pgwake.queue_claimable(claim_queue)
              AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
              AND CASE WHEN ordering_key IS NULL THEN true
                       ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
            ORDER BY queue, priority, run_at, id
            LIMIT claim_limit
            FOR UPDATE SKIP LOCKED))
        RETURNING *
    )
    INSERT INTO pgwake.leased_jobs AS l
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
         ordering_at, holds_slot)
    SELECT c.id, c.queue, c.task, c.payload, c.priority, c.run_at, c.attempts + 1,
           c.max_attempts, c.last_error, c.created_at, c.timeout, worker, now(),
           now() + make_interval(secs => lease_seconds), c.ordering_key, c.unique_key,
           c.ordering_at, false
    FROM c
    RETURNING l.id, l.queue, l.task, l.payload::text, l.priority, l.run_at, l.attempts,
              l.max_attempts, l.last_error, l.created_at, extract(epoch FROM l.timeout)::float8,
              extract(epoch FROM clock_timestamp() - greatest(l.created_at, l.run_at))::float8,
              l.token, l.ordering_key, l.unique_key, coalesce(l.ordering_at, l.run_at);
END
$$;
