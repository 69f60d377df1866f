-- The claim path's functions: the four plain claims, the pause/limit
-- filter of the one-queue claims, the fair claims' read of the ready
-- queues, and the trigger that frees a lease's queue slot. Re-applied by
-- `pgwake migrate` whenever this file's text changes (schema.rs), so a
-- change to a claim is an edit here, not a migration that repeats the
-- bodies. Migrations 0011-0013 first created them; why each is planned and
-- written as it is: their headers and ARCHITECTURE.md ("Claims plan once,
-- and walk the index").
--
-- Every claim walks a claim index that leaves out held jobs (keyed jobs
-- waiting behind an earlier job of their key, migration 0017):
-- jobs_claim_idx over every queue, jobs_queue_ready_idx for one queue.
--
-- The claims share their predicate with src/db/sql/claim_*_limited.sql and
-- claim_tx_one.sql (which are not functions: they take queue slots and
-- admissions): tests/repository/layout.rs checks that every claim says the task
-- filter and the ordering-key test in the same words, and returns the same
-- columns as the other claims of its mode.

-- Fenced by the token, which is never reused: a second release of the same
-- lease matches nothing, so it can never free a slot another run holds
-- (solid_queue's issue #761). Every way a lease ends (done, retry, bury,
-- rescue, cancel) deletes its row, so no code path can forget.
CREATE OR REPLACE FUNCTION pgwake.release_queue_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgwake.queue_slots SET lease_token = NULL WHERE lease_token = OLD.token;
    RETURN NULL;
END
$$;

-- Whether the plain claims may take jobs of `queue`: no row of
-- pgwake.queues pauses or limits it, or makes it fair between keys (such a
-- queue is claimed by src/db/sql/claim_*_limited.sql). src/db/sql/claim_{tx,lease}_queue.sql call it
-- with the queue as a parameter: a call without columns and not volatile is
-- a one-time filter of the claim, evaluated once, in the claim's snapshot
-- (STABLE), as the NOT EXISTS subquery it replaces was. That subquery was
-- planned on every claim (the claims use custom plans, ARCHITECTURE.md →
-- "Claims plan once, and walk the index"): 0.02–0.03 ms of the 0.14 ms a
-- one-job claim took to plan; PL/pgSQL plans its query once per session.
CREATE OR REPLACE FUNCTION pgwake.queue_claimable(queue text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM pgwake.queues q
                       WHERE q.name = queue
                         AND (q.paused OR q.max_running IS NOT NULL OR q.rate_count IS NOT NULL
                              OR q.fair_keys OR q.key_limits OR q.key_rate_count IS NOT NULL));
END
$$;

-- tx-mode claim over every queue but `skip_queues` (claimed by other specs
-- of the worker), of the jobs after (after_priority, after_run_at,
-- after_id) in claim order: the claim starts there in jobs_claim_idx
-- instead of at its head (src/claim/choose/cursor.rs: under database pressure,
-- the head holds the index entries of every job claimed since the vacuum
-- horizon was pinned, which no claim can remove and each would walk). Runs inside the claim transaction: the rows stay
-- deleted-but-uncommitted (locked) while their handlers run and come back
-- by themselves if the worker dies. Returns the claim columns, the claim
-- transaction's xid (for the batch marker) and its server process (to
-- cancel a timed-out handler's statement).
CREATE OR REPLACE FUNCTION pgwake.claim_tx_all_after(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[],
    after_priority integer, after_run_at timestamptz, after_id bigint)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               xid text, backend_pid integer,
               ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, release_s double precision)
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
        -- updates a waiting job only to hold or release it, migration 0017,
        -- skipping locked rows), and VACUUM never moves a live row.
        -- A row that someone's UPDATE changed after this statement's
        -- snapshot was taken comes back locked at its new address, which the
        -- snapshot does not see: it is not claimed now, and stays for a
        -- later claim (this transaction's lock on it ends with it).
        DELETE FROM pgwake.jobs
        WHERE ctid = ANY(ARRAY(
            SELECT ctid FROM pgwake.jobs
            WHERE run_at <= now() AND queue <> ALL(skip_queues)
              -- After the cursor: an index bound (the index's own order).
              AND (priority, run_at, id) > (after_priority, after_run_at, after_id)
              -- Paused and limited queues (limited ones are claimed by
              -- claim_*_limited.sql): one scan of pgwake.queues into a hash.
              AND queue NOT IN (SELECT name FROM pgwake.queues
                                WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL
                                   OR fair_keys OR key_limits OR key_rate_count IS NOT NULL)
              AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
              -- Not a keyed job waiting behind an earlier one of its key
              -- (migration 0017): the claim indexes leave those out.
              AND NOT held
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
           c.ordering_key, c.unique_key, coalesce(c.ordering_at, c.run_at), c.limit_key,
           -- a flow's child released by its parents (migration 0045)
           CASE WHEN c.released_at IS NOT NULL
                THEN extract(epoch FROM clock_timestamp() - greatest(c.released_at, c.run_at))::float8 END
    FROM c;
END
$$;

-- tx-mode claim over every queue but `skip_queues`: the claim above from
-- the head of the index (before every job: ids start at 1).
CREATE OR REPLACE FUNCTION pgwake.claim_tx_all(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               xid text, backend_pid integer,
               ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, release_s double precision)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM pgwake.claim_tx_all_after(claim_limit, skip_queues, only_tasks, never_tasks,
                                            -2147483648, '-infinity', -9223372036854775808)
$$;

-- tx-mode claim from one queue, in claim order on jobs_queue_ready_idx.
CREATE OR REPLACE FUNCTION pgwake.claim_tx_queue(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[])
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               xid text, backend_pid integer,
               ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, release_s double precision)
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
              AND NOT held
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
           c.ordering_key, c.unique_key, coalesce(c.ordering_at, c.run_at), c.limit_key,
           -- a flow's child released by its parents (migration 0045)
           CASE WHEN c.released_at IS NOT NULL
                THEN extract(epoch FROM clock_timestamp() - greatest(c.released_at, c.run_at))::float8 END
    FROM c;
END
$$;

-- claim_tx_queue, of the jobs after (after_priority, after_run_at, after_id)
-- in the queue's claim order: under database pressure (src/claim/choose/cursor.rs)
-- a claim of one queue resumes after the last job claimed from it instead
-- of walking the head of its range, where a held vacuum horizon keeps the
-- entries of every job claimed since.
CREATE OR REPLACE FUNCTION pgwake.claim_tx_queue_after(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[],
    after_priority integer, after_run_at timestamptz, after_id bigint)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               xid text, backend_pid integer,
               ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, release_s double precision)
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
            -- After the cursor: an index bound (the index's own order).
            WHERE (queue, priority, run_at, id) > (claim_queue, after_priority, after_run_at, after_id)
              AND queue <= claim_queue AND run_at <= now()
              -- Paused or limited: a one-time filter (migration 0011).
              AND pgwake.queue_claimable(claim_queue)
              AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
              AND NOT held
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
           c.ordering_key, c.unique_key, coalesce(c.ordering_at, c.run_at), c.limit_key,
           -- a flow's child released by its parents (migration 0045)
           CASE WHEN c.released_at IS NOT NULL
                THEN extract(epoch FROM clock_timestamp() - greatest(c.released_at, c.run_at))::float8 END
    FROM c;
END
$$;

-- lease-mode claim over every queue but `skip_queues`, of the jobs after
-- (`after_priority`, `after_run_at`, `after_id`) in claim order
-- (src/claim/choose/cursor.rs: under database pressure, claims resume after the
-- last job claimed instead of walking the head of the claim index, where
-- the entries of jobs claimed while the vacuum horizon is held stay).
-- Moves the jobs into pgwake.leased_jobs in one statement, with this attempt counted and a
-- fresh claim token (never reused: every later write of this run is fenced
-- by it). `holds_slot` false: these queues have no max_running limit
-- (migration 0011).
--
-- `run_now`: how many of the jobs, the first in claim order, go straight to
-- free slots; the others go into the worker's prefetch buffer and are
-- marked `buffered` (migration 0024: the rescue refunds a buffered lease's
-- attempt). A suspect (a job so refunded before) is never buffered: a claim
-- for the buffer alone (`run_now` 0) skips suspects, and one past the free
-- slots is left for a later claim.
CREATE OR REPLACE FUNCTION pgwake.claim_lease_all_after(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision, run_now bigint,
    after_priority integer, after_run_at timestamptz, after_id bigint)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, suspect boolean, buffered boolean,
               release_s double precision)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    picked tid[];
BEGIN
    -- In claim order (the index walk's): the first `run_now` go to free
    -- slots, the rest to the buffer.
    picked := ARRAY(
        SELECT ctid FROM pgwake.jobs
        WHERE run_at <= now() AND queue <> ALL(skip_queues)
          -- After the cursor: an index bound (the index's own order).
          AND (priority, run_at, id) > (after_priority, after_run_at, after_id)
          AND queue NOT IN (SELECT name FROM pgwake.queues
                            WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL
                               OR fair_keys OR key_limits OR key_rate_count IS NOT NULL)
          AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
          AND (run_now > 0 OR NOT suspect)
          AND NOT held
          AND CASE WHEN ordering_key IS NULL THEN true
                   ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
        ORDER BY priority, run_at, id
        LIMIT claim_limit
        FOR UPDATE SKIP LOCKED);
    RETURN QUERY
    WITH r AS (
        -- A suspect is never buffered: one past the free slots stays
        -- (locked until this transaction ends, then claimable again).
        DELETE FROM pgwake.jobs j
        WHERE j.ctid = ANY(picked)
          AND (NOT j.suspect OR j.ctid = ANY(picked[1:run_now]))
        RETURNING j.*, NOT (j.ctid = ANY(picked[1:run_now])) AS in_buffer
    )
    INSERT INTO pgwake.leased_jobs AS l
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
         ordering_at, holds_slot, limit_key, suspect, buffered, released_at)
    SELECT r.id, r.queue, r.task, r.payload, r.priority, r.run_at, r.attempts + 1,
           r.max_attempts, r.last_error, r.created_at, r.timeout, worker, now(),
           now() + make_interval(secs => lease_seconds), r.ordering_key, r.unique_key,
           r.ordering_at, false, r.limit_key, r.suspect, r.in_buffer, r.released_at
    FROM r
    RETURNING l.id, l.queue, l.task, l.payload::text, l.priority, l.run_at, l.attempts,
              l.max_attempts, l.last_error, l.created_at, extract(epoch FROM l.timeout)::float8,
              extract(epoch FROM clock_timestamp() - greatest(l.created_at, l.run_at))::float8,
              l.token, l.ordering_key, l.unique_key, coalesce(l.ordering_at, l.run_at), l.limit_key,
              l.suspect, l.buffered,
              -- a flow's child released by its parents (migration 0045)
              CASE WHEN l.released_at IS NOT NULL
                THEN extract(epoch FROM clock_timestamp() - greatest(l.released_at, l.run_at))::float8 END;
END
$$;

-- claim_lease_all_after from the head (every claim but those under
-- pressure, src/claim/lease/mod.rs).
CREATE OR REPLACE FUNCTION pgwake.claim_lease_all(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision, run_now bigint)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, suspect boolean, buffered boolean,
               release_s double precision)
LANGUAGE sql VOLATILE AS $$
    SELECT * FROM pgwake.claim_lease_all_after(claim_limit, skip_queues, only_tasks, never_tasks,
                                               worker, lease_seconds, run_now,
                                               -2147483648, '-infinity', -9223372036854775808)
$$;

-- lease-mode claim from one queue, in claim order on jobs_queue_ready_idx;
-- `run_now` as in claim_lease_all.
CREATE OR REPLACE FUNCTION pgwake.claim_lease_queue(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision, run_now bigint)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, suspect boolean, buffered boolean,
               release_s double precision)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    picked tid[];
BEGIN
    -- In claim order (the index walk's): the first `run_now` go to free
    -- slots, the rest to the buffer.
    picked := ARRAY(
        SELECT ctid FROM pgwake.jobs
        WHERE queue >= claim_queue AND queue <= claim_queue AND run_at <= now()
          AND pgwake.queue_claimable(claim_queue)
          AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
          AND (run_now > 0 OR NOT suspect)
          AND NOT held
          AND CASE WHEN ordering_key IS NULL THEN true
                   ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
        ORDER BY queue, priority, run_at, id
        LIMIT claim_limit
        FOR UPDATE SKIP LOCKED);
    RETURN QUERY
    WITH r AS (
        -- A suspect is never buffered: one past the free slots stays
        -- (locked until this transaction ends, then claimable again).
        DELETE FROM pgwake.jobs j
        WHERE j.ctid = ANY(picked)
          AND (NOT j.suspect OR j.ctid = ANY(picked[1:run_now]))
        RETURNING j.*, NOT (j.ctid = ANY(picked[1:run_now])) AS in_buffer
    )
    INSERT INTO pgwake.leased_jobs AS l
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
         ordering_at, holds_slot, limit_key, suspect, buffered, released_at)
    SELECT r.id, r.queue, r.task, r.payload, r.priority, r.run_at, r.attempts + 1,
           r.max_attempts, r.last_error, r.created_at, r.timeout, worker, now(),
           now() + make_interval(secs => lease_seconds), r.ordering_key, r.unique_key,
           r.ordering_at, false, r.limit_key, r.suspect, r.in_buffer, r.released_at
    FROM r
    RETURNING l.id, l.queue, l.task, l.payload::text, l.priority, l.run_at, l.attempts,
              l.max_attempts, l.last_error, l.created_at, extract(epoch FROM l.timeout)::float8,
              extract(epoch FROM clock_timestamp() - greatest(l.created_at, l.run_at))::float8,
              l.token, l.ordering_key, l.unique_key, coalesce(l.ordering_at, l.run_at), l.limit_key,
              l.suspect, l.buffered,
              -- a flow's child released by its parents (migration 0045)
              CASE WHEN l.released_at IS NOT NULL
                THEN extract(epoch FROM clock_timestamp() - greatest(l.released_at, l.run_at))::float8 END;
END
$$;

-- claim_lease_queue, of the jobs after (after_priority, after_run_at, after_id)
-- in the queue's claim order: under database pressure (src/claim/choose/cursor.rs)
-- a claim of one queue resumes after the last job claimed from it instead
-- of walking the head of its range, where a held vacuum horizon keeps the
-- entries of every job claimed since.
CREATE OR REPLACE FUNCTION pgwake.claim_lease_queue_after(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision, run_now bigint,
    after_priority integer, after_run_at timestamptz, after_id bigint)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text, suspect boolean, buffered boolean,
               release_s double precision)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    picked tid[];
BEGIN
    -- In claim order (the index walk's): the first `run_now` go to free
    -- slots, the rest to the buffer.
    picked := ARRAY(
        SELECT ctid FROM pgwake.jobs
        -- After the cursor: an index bound (the index's own order).
        WHERE (queue, priority, run_at, id) > (claim_queue, after_priority, after_run_at, after_id)
          AND queue <= claim_queue AND run_at <= now()
          AND pgwake.queue_claimable(claim_queue)
          AND (only_tasks IS NULL OR task = ANY(only_tasks)) AND task <> ALL(never_tasks)
          AND (run_now > 0 OR NOT suspect)
          AND NOT held
          AND CASE WHEN ordering_key IS NULL THEN true
                   ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
        ORDER BY queue, priority, run_at, id
        LIMIT claim_limit
        FOR UPDATE SKIP LOCKED);
    RETURN QUERY
    WITH r AS (
        -- A suspect is never buffered: one past the free slots stays
        -- (locked until this transaction ends, then claimable again).
        DELETE FROM pgwake.jobs j
        WHERE j.ctid = ANY(picked)
          AND (NOT j.suspect OR j.ctid = ANY(picked[1:run_now]))
        RETURNING j.*, NOT (j.ctid = ANY(picked[1:run_now])) AS in_buffer
    )
    INSERT INTO pgwake.leased_jobs AS l
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
         ordering_at, holds_slot, limit_key, suspect, buffered, released_at)
    SELECT r.id, r.queue, r.task, r.payload, r.priority, r.run_at, r.attempts + 1,
           r.max_attempts, r.last_error, r.created_at, r.timeout, worker, now(),
           now() + make_interval(secs => lease_seconds), r.ordering_key, r.unique_key,
           r.ordering_at, false, r.limit_key, r.suspect, r.in_buffer, r.released_at
    FROM r
    RETURNING l.id, l.queue, l.task, l.payload::text, l.priority, l.run_at, l.attempts,
              l.max_attempts, l.last_error, l.created_at, extract(epoch FROM l.timeout)::float8,
              extract(epoch FROM clock_timestamp() - greatest(l.created_at, l.run_at))::float8,
              l.token, l.ordering_key, l.unique_key, coalesce(l.ordering_at, l.run_at), l.limit_key,
              l.suspect, l.buffered,
              -- a flow's child released by its parents (migration 0045)
              CASE WHEN l.released_at IS NOT NULL
                THEN extract(epoch FROM clock_timestamp() - greatest(l.released_at, l.run_at))::float8 END;
END
$$;

-- The claims of workers older than schema 24 (no `run_now`), kept so that
-- workers still running through `pgwake migrate` go on claiming: every job
-- they take counts as started at once (charged on a crash, as before).
CREATE OR REPLACE FUNCTION pgwake.claim_lease_all(
    claim_limit bigint, skip_queues text[], only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text)
LANGUAGE sql VOLATILE AS $$
    SELECT c.id, c.queue, c.task, c.payload, c.priority, c.run_at, c.attempts, c.max_attempts,
           c.last_error, c.created_at, c.timeout_s, c.pickup_s, c.token, c.ordering_key,
           c.unique_key, c.ordering_at, c.limit_key
    FROM pgwake.claim_lease_all(claim_limit, skip_queues, only_tasks, never_tasks, worker,
                                lease_seconds, claim_limit) c
$$;

CREATE OR REPLACE FUNCTION pgwake.claim_lease_queue(
    claim_limit bigint, claim_queue text, only_tasks text[], never_tasks text[],
    worker text, lease_seconds double precision)
RETURNS TABLE (id bigint, queue text, task text, payload text, priority integer,
               run_at timestamptz, attempts integer, max_attempts integer, last_error text,
               created_at timestamptz, timeout_s double precision, pickup_s double precision,
               token bigint, ordering_key text, unique_key text, ordering_at timestamptz,
               limit_key text)
LANGUAGE sql VOLATILE AS $$
    SELECT c.id, c.queue, c.task, c.payload, c.priority, c.run_at, c.attempts, c.max_attempts,
           c.last_error, c.created_at, c.timeout_s, c.pickup_s, c.token, c.ordering_key,
           c.unique_key, c.ordering_at, c.limit_key
    FROM pgwake.claim_lease_queue(claim_limit, claim_queue, only_tasks, never_tasks, worker,
                                  lease_seconds, claim_limit) c
$$;

-- The queues that have a ready job, but those in `skip_queues` and paused
-- ones, at most `max_queues`, in name order. A held job (migration 0017)
-- is not ready: a queue of held jobs only is not claimed. The reads walk
-- jobs_queue_ready_idx, which leaves them out.
CREATE OR REPLACE FUNCTION pgwake.ready_queues(skip_queues text[], max_queues bigint)
RETURNS TABLE (queue text)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    -- Each queue's probe returns the queue's first job this statement sees,
    -- and the ready check starts there, not at the queue's first index
    -- entry: a held vacuum horizon leaves the entries of every job claimed
    -- since at the head of the queue's range, each a heap visit for every
    -- read that starts there (none is dead to every snapshot), and the two
    -- reads from the head walked them twice (48 ms a read, up to 119 ms,
    -- after three pinned minutes at 1,500 jobs/s).
    WITH RECURSIVE qs AS (
        (SELECT j.queue, j.priority, j.run_at, j.id FROM pgwake.jobs j WHERE NOT j.held
         ORDER BY j.queue, j.priority, j.run_at, j.id LIMIT 1)
        UNION ALL
        SELECT n.queue, n.priority, n.run_at, n.id
        FROM qs CROSS JOIN LATERAL (
            SELECT j.queue, j.priority, j.run_at, j.id FROM pgwake.jobs j
            WHERE NOT j.held AND j.queue > qs.queue
            ORDER BY j.queue, j.priority, j.run_at, j.id LIMIT 1
        ) n
    )
    SELECT qs.queue
    FROM qs
    WHERE qs.queue <> ALL(skip_queues)
      AND qs.queue <> ALL(ARRAY(SELECT q.name FROM pgwake.queues q WHERE q.paused))
      -- The index walks the queue's first priority first: it stops at the
      -- first ready job, and reads past the scheduled ones ahead of it.
      AND (qs.run_at <= now()
           OR (SELECT true FROM pgwake.jobs j
               WHERE (j.queue, j.priority, j.run_at, j.id) > (qs.queue, qs.priority, qs.run_at, qs.id)
                 AND j.queue <= qs.queue AND j.run_at <= now() AND NOT j.held
               ORDER BY j.queue, j.priority, j.run_at, j.id
               LIMIT 1))
    LIMIT max_queues;
END
$$;

-- Jobs of `queue` running without a queue slot: claimed while the queue had
-- no max_running limit (lease: holds_slot false; tx: named in their batch's
-- durable mark, migration 0015). A limit set while they run counts them:
-- the limited claims use only slots 1..max_running minus these.
CREATE OR REPLACE FUNCTION pgwake.unslotted_running(queue text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM pgwake.leased_jobs l
            WHERE l.queue = unslotted_running.queue AND NOT l.holds_slot)
         + (SELECT count(*) FROM pgwake.tx_batches b, unnest(b.queues) AS bq(name)
            WHERE bq.name = unslotted_running.queue)
$$;

-- Jobs of key `limit_key` of `queue` running without a key slot: claimed
-- while the key had no limit (lease: holds_key_slot false; tx: named in
-- their batch's mark, migration 0022). As unslotted_running, for one key:
-- src/db/sql/claim_tx_one.sql uses only slots 1..limit minus these
-- (pgwake.fair_key_jobs reads them for every key at once).
CREATE OR REPLACE FUNCTION pgwake.unslotted_key_running(queue text, limit_key text) RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM pgwake.leased_jobs l
            WHERE l.queue = unslotted_key_running.queue
              AND l.limit_key = unslotted_key_running.limit_key AND NOT l.holds_key_slot)
         + (SELECT count(*) FROM pgwake.tx_batches b, unnest(b.key_queues, b.limit_keys) AS t(q, k)
            WHERE b.limit_keys IS NOT NULL AND t.q = unslotted_key_running.queue
              AND t.k = unslotted_key_running.limit_key)
$$;

-- The most limit keys one call of pgwake.fair_key_jobs or
-- pgwake.reserve_key_admissions passes over (visits without taking a job or
-- an admission: a key at its limit or rate, or with no job this worker can
-- take now); the keys it takes from are at most its `wanted`. A call that
-- reaches it stops and reports the last key it visited, and the worker's
-- rotation resumes after that key (src/claim/choose/key_rotation.rs), so a key with
-- a ready job is visited within ceil(keys / bound) calls of one worker.
-- Before, one call visited every key (measured: 0.03-0.5 ms a key in a
-- reservation, 10,000 keys at their rate up to 4.6 s a reservation; 0.055
-- ms a key in a claim). 128 keeps a call's cost flat however many keys wait
-- (a reservation 4-6 ms, a claim's choice 7-8 ms with 1,000 or 10,000 keys
-- all at their rate or limit: docs/src/queues.md), while what a call costs
-- besides its keys (a round trip, its setup) stays small beside a walk of
-- 128 keys, so a lap of every key costs about what one call did before; and
-- a ready key behind the others waits ceil(keys / 128) calls, which the
-- worker makes back to back (src/claim/choose/key_rotation.rs).
CREATE OR REPLACE FUNCTION pgwake.key_walk_bound() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT 128
$$;

-- The ready jobs a claim of fair-keys queue `claim_queue` takes (migration
-- 0020; ARCHITECTURE.md → "Fair keys: a rotation between limit keys"), at
-- most `wanted`, locked (FOR UPDATE SKIP LOCKED) for the calling claim,
-- which deletes them; with each, the key slot it holds (per-key limits) or
-- NULL.
--
-- The groups of the queue's ready jobs are its limit keys, in byte order,
-- and its jobs without a key, one group placed before the first key. A
-- pass visits every group once, starting after `after_key` (the last key
-- this worker served; NULL: the start, after the keyless group) and
-- wrapping around, and takes each group's first ready job in claim order
-- (priority, run_at, id). Passes repeat until `wanted` jobs are taken or a
-- pass takes nothing, or pgwake.key_walk_bound() keys were passed over
-- (visited without a job taken): then a row with `id` NULL and `stop_key`
-- the last key visited ends the result, and the worker's rotation resumes
-- after it. So a claim of n jobs serves n different groups when there are
-- that many, each claim moves the rotation on by at least min(n, bound)
-- groups or round all of them, and a group with a ready job is served
-- within ceil(groups / min(n, bound)) claims of one worker, whatever the
-- other groups hold. Keys are found by a skip scan of
-- jobs_limit_key_ready_idx (one probe per key visited; under a per-key
-- rate only the admitted keys are visited, from the array); the keyless
-- group by a walk of jobs_queue_ready_idx, which passes the keyed jobs
-- ahead of its first keyless one.
--
-- Per-key limits (the queue's `key_limits`): a key's job is taken only with
-- a free slot of the key (a row of pgwake.key_slots numbered 1..the key's
-- limit, `lease_token` NULL, locked FOR UPDATE SKIP LOCKED, which
-- re-checks the token on the newest row version), and no key slot above
-- the limit may remain (a lowered limit: the free ones are deleted here,
-- a held one blocks the key until its job ends). A full key is passed
-- over, never waited for: the rotation goes on to the next key. Jobs of the
-- key running without a key slot (claimed while it had no limit,
-- migration 0022: leases with `holds_key_slot` false, tx-mode jobs named
-- by their batch's mark) count against the limit: only slots 1..limit
-- minus those are used, so no new job of the key starts until fewer than
-- its limit run (read once per call, in an array: empty in the steady
-- state).
--
-- A key with a ready job but fewer than its limit's rows 1..limit (a job
-- inserted while the rescuer's sweep deleted its key's rows, or while a
-- limit change resized them: ARCHITECTURE.md → "Limit keys") is reported,
-- as a row with `id` NULL and `repair_key` the key: the worker adds the
-- missing rows in a statement of its own (pgwake.repair_key_slots), never
-- in the claim, whose tx-mode transaction lasts as long as its jobs run
-- (rows it inserted would make every producer of the key wait for it).
--
-- Per-key rate (the queue's `key_rate_count`, migration 0021): a key's job
-- is taken only with an admission of the key, reserved before the claim by
-- pgwake.reserve_key_admissions: `admitted_keys` names each admitted key
-- once per admission, and at most that many jobs of a key are taken (NULL:
-- none admitted, so no keyed job is taken). Jobs without a key need none.
CREATE OR REPLACE FUNCTION pgwake.fair_key_jobs(
    claim_queue text, after_key text, wanted bigint, only_tasks text[], never_tasks text[],
    admitted_keys text[] DEFAULT NULL)
RETURNS TABLE (id bigint, key_slot integer, repair_key text, stop_key text)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_variable
DECLARE
    picked bigint[] := '{}';
    slot_keys text[] := '{}';
    slot_nos integer[] := '{}';
    k text;
    j bigint;
    ks integer;
    lim integer;
    per_key integer;
    limited boolean;
    rated boolean;
    took_keys text[] := '{}';
    took boolean;
    part integer;
    unslotted text[] := '{}';
    top integer;
    have bigint;
    bound integer := pgwake.key_walk_bound();
    passed integer := 0;
    prev text;
BEGIN
    IF coalesce(wanted, 0) < 1 THEN
        RETURN;
    END IF;
    stop_key := NULL;
    SELECT q.key_limits, q.max_running_per_key, q.key_rate_count IS NOT NULL
    INTO limited, per_key, rated
    FROM pgwake.queues q WHERE q.name = claim_queue;
    limited := coalesce(limited, false);
    rated := coalesce(rated, false);
    IF limited THEN
        -- The keys of the queue's jobs running without a key slot, one
        -- entry per job (migration 0022).
        unslotted := ARRAY(
            SELECT l.limit_key FROM pgwake.leased_jobs l
            WHERE l.queue = claim_queue AND l.limit_key IS NOT NULL AND NOT l.holds_key_slot
            UNION ALL
            SELECT t.k FROM pgwake.tx_batches b, unnest(b.key_queues, b.limit_keys) AS t(q, k)
            WHERE b.limit_keys IS NOT NULL AND t.q = claim_queue);
    END IF;
    LOOP
        took := false;
        -- part 1: keys after after_key; 2: the keyless group; 3: keys from
        -- the first up to after_key.
        FOR part IN 1..3 LOOP
            IF part = 2 THEN
                SELECT x.id INTO j FROM pgwake.jobs x
                WHERE x.queue = claim_queue AND x.limit_key IS NULL AND NOT x.held
                  AND x.run_at <= now()
                  AND (only_tasks IS NULL OR x.task = ANY(only_tasks)) AND x.task <> ALL(never_tasks)
                  AND x.id <> ALL(picked)
                  AND CASE WHEN x.ordering_key IS NULL THEN true
                           ELSE pgwake.ordering_free(x.ordering_key, x.priority,
                                                     coalesce(x.ordering_at, x.run_at), x.id) END
                ORDER BY x.queue, x.priority, x.run_at, x.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    picked := picked || j;
                    took := true;
                    id := j;
                    key_slot := NULL;
                    RETURN NEXT;
                    IF cardinality(picked) >= wanted THEN
                        RETURN;
                    END IF;
                END IF;
                CONTINUE;
            END IF;
            IF part = 3 AND after_key IS NULL THEN
                CONTINUE;
            END IF;
            k := CASE WHEN part = 1 THEN after_key END;
            LOOP
                IF rated THEN
                    -- Per-key rate: only the admitted keys can be taken
                    -- from; the next of them in byte order.
                    k := (SELECT min(a.ak COLLATE "C") FROM unnest(admitted_keys) a(ak)
                          WHERE k IS NULL OR a.ak COLLATE "C" > k);
                -- The next key of a ready-or-scheduled job (skip scan).
                -- Two statements, not `k IS NULL OR limit_key > k`: the
                -- generic plan of that cannot bound the index scan by k and
                -- walked every keyed job of the queue for each key (a claim
                -- passing over 1,000 keys: 2.5 s; 4,000: 18.6 s).
                ELSIF k IS NULL THEN
                    SELECT x.limit_key INTO k FROM pgwake.jobs x
                    WHERE x.queue = claim_queue AND x.limit_key IS NOT NULL AND NOT x.held
                    ORDER BY x.queue, x.limit_key COLLATE "C"
                    LIMIT 1;
                ELSE
                    SELECT x.limit_key INTO k FROM pgwake.jobs x
                    WHERE x.queue = claim_queue AND x.limit_key IS NOT NULL AND NOT x.held
                      AND x.limit_key COLLATE "C" > k
                    ORDER BY x.queue, x.limit_key COLLATE "C"
                    LIMIT 1;
                END IF;
                -- (SELECT INTO sets k NULL when it finds no row.)
                EXIT WHEN k IS NULL;
                EXIT WHEN part = 3 AND k COLLATE "C" > after_key;
                -- Per-key rate: no admission of the key left for this claim.
                CONTINUE WHEN rated
                    AND (SELECT count(*) FROM unnest(admitted_keys) a(ak) WHERE ak = k)
                        <= (SELECT count(*) FROM unnest(took_keys) t(tk) WHERE tk = k);
                -- The bound: `bound` keys passed over (visited without a
                -- job taken) end the claim before this one, and the last
                -- key visited is reported (a row with `stop_key`): the
                -- worker's rotation resumes after it.
                IF passed >= bound THEN
                    id := NULL;
                    key_slot := NULL;
                    repair_key := NULL;
                    stop_key := prev;
                    RETURN NEXT;
                    RETURN;
                END IF;
                prev := k;
                -- Counted as passed over until a job of it is taken.
                passed := passed + 1;
                ks := NULL;
                lim := NULL;
                IF limited THEN
                    lim := coalesce((SELECT l.max_running FROM pgwake.queue_key_limits l
                                     WHERE l.queue = claim_queue AND l.limit_key = k), per_key);
                END IF;
                IF lim IS NOT NULL THEN
                    -- A job to take, first (no lock): a slot is locked only
                    -- for a key that has one.
                    CONTINUE WHEN NOT EXISTS (
                        SELECT FROM pgwake.jobs x
                        WHERE x.queue = claim_queue AND x.limit_key COLLATE "C" = k AND NOT x.held
                          AND x.run_at <= now()
                          AND (only_tasks IS NULL OR x.task = ANY(only_tasks))
                          AND x.task <> ALL(never_tasks)
                          AND x.id <> ALL(picked));
                    -- The key's rows: its highest slot, and how many of
                    -- 1..lim exist (fewer: some are missing, reported).
                    SELECT coalesce(max(y.slot), 0), count(*) FILTER (WHERE y.slot <= lim)
                    INTO top, have
                    FROM pgwake.key_slots y WHERE y.queue = claim_queue AND y.limit_key = k;
                    IF have < lim THEN
                        id := NULL;
                        key_slot := NULL;
                        repair_key := k;
                        RETURN NEXT;
                        repair_key := NULL;
                    END IF;
                    IF top > lim THEN
                        -- A lowered limit: free rows above it go; a held
                        -- one blocks the key.
                        DELETE FROM pgwake.key_slots s
                        WHERE (s.queue, s.limit_key, s.slot) IN (
                            SELECT y.queue, y.limit_key, y.slot FROM pgwake.key_slots y
                            WHERE y.queue = claim_queue AND y.limit_key = k AND y.slot > lim
                              AND y.lease_token IS NULL
                            FOR UPDATE OF y SKIP LOCKED);
                        CONTINUE WHEN EXISTS (SELECT FROM pgwake.key_slots y
                                              WHERE y.queue = claim_queue AND y.limit_key = k
                                                AND y.slot > lim);
                    END IF;
                    SELECT y.slot INTO ks FROM pgwake.key_slots y
                    WHERE y.queue = claim_queue AND y.limit_key = k
                      -- the key's jobs running without a slot count
                      AND y.slot <= lim - CASE WHEN cardinality(unslotted) = 0 THEN 0
                                               ELSE (SELECT count(*) FROM unnest(unslotted) AS u(uk)
                                                     WHERE u.uk = k) END
                      AND y.lease_token IS NULL
                      AND NOT EXISTS (SELECT FROM unnest(slot_keys, slot_nos) AS t(tk, tn)
                                      WHERE tk = k AND tn = y.slot)
                    ORDER BY y.slot
                    LIMIT 1
                    FOR UPDATE OF y SKIP LOCKED;
                    CONTINUE WHEN NOT FOUND;
                END IF;
                SELECT x.id INTO j FROM pgwake.jobs x
                WHERE x.queue = claim_queue AND x.limit_key COLLATE "C" = k AND NOT x.held
                  AND x.run_at <= now()
                  AND (only_tasks IS NULL OR x.task = ANY(only_tasks)) AND x.task <> ALL(never_tasks)
                  AND x.id <> ALL(picked)
                  AND CASE WHEN x.ordering_key IS NULL THEN true
                           ELSE pgwake.ordering_free(x.ordering_key, x.priority,
                                                     coalesce(x.ordering_at, x.run_at), x.id) END
                ORDER BY x.queue, x.limit_key COLLATE "C", x.priority, x.run_at, x.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED;
                IF FOUND THEN
                    passed := passed - 1;
                    picked := picked || j;
                    took_keys := took_keys || k;
                    IF ks IS NOT NULL THEN
                        slot_keys := slot_keys || k;
                        slot_nos := slot_nos || ks;
                    END IF;
                    took := true;
                    id := j;
                    key_slot := ks;
                    RETURN NEXT;
                    IF cardinality(picked) >= wanted THEN
                        RETURN;
                    END IF;
                END IF;
            END LOOP;
        END LOOP;
        EXIT WHEN NOT took;
    END LOOP;
END
$$;

-- One admission of limit key `k` of `claim_queue` (per-key rate, migration
-- 0021), for pgwake.reserve_key_admissions: the key's oldest admission slot
-- whose last admission is at least `win` old, or a new slot while the key
-- has fewer than `cnt`, stamped with now(). Returns the slot taken, or NULL
-- and when the key's next slot frees.
--
-- FOR UPDATE SKIP LOCKED re-checks `last_start` on the newest row version,
-- so two concurrent reservations never take one slot; a new slot is an
-- INSERT of the next number, and the primary key lets only one of two
-- concurrent inserts of one number through (the other takes nothing now).
-- The advisory lock under which a reservation inserts admission slot rows
-- of key `k` of `queue` (pgwake.take_key_admission): tag 'pgwk', then a
-- hash of both (two keys sharing a hash only pass each other over).
CREATE OR REPLACE FUNCTION pgwake.key_rate_lock(queue text, k text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (x'7067776b'::bigint << 32)
           | (hashtext(queue || chr(31) || k)::bigint & x'ffffffff'::bigint)
$$;

CREATE OR REPLACE FUNCTION pgwake.take_key_admission(claim_queue text, k text, cnt integer, win interval)
RETURNS TABLE (slot integer, next_free timestamptz)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_variable
DECLARE
    s integer;
    have bigint;
BEGIN
    SELECT y.slot INTO s FROM pgwake.key_rate_slots y
    WHERE y.queue = claim_queue AND y.limit_key = k AND y.last_start <= now() - win
      AND y.slot <= cnt
    ORDER BY y.last_start
    LIMIT 1
    FOR UPDATE OF y SKIP LOCKED;
    IF FOUND THEN
        UPDATE pgwake.key_rate_slots y SET prev_start = y.last_start, last_start = now()
        WHERE y.queue = claim_queue AND y.limit_key = k AND y.slot = s;
        slot := s;
        next_free := NULL;
        RETURN NEXT;
        RETURN;
    END IF;
    SELECT coalesce(max(y.slot), 0) + 1, count(*) INTO s, have FROM pgwake.key_rate_slots y
    WHERE y.queue = claim_queue AND y.limit_key = k AND y.slot <= cnt;
    IF have < cnt THEN
        IF s > cnt THEN
            -- A gap left by the clean-up of idle rows.
            SELECT min(g) INTO s FROM generate_series(1, cnt) g
            WHERE NOT EXISTS (SELECT FROM pgwake.key_rate_slots y
                              WHERE y.queue = claim_queue AND y.limit_key = k AND y.slot = g);
        END IF;
        -- Another reservation may be inserting this key's rows this
        -- instant: waiting on its uncommitted row (as the unique index
        -- makes an insert do) deadlocked reservations whose rotations met
        -- in opposite orders. The key's lock, held to the end of this
        -- statement's transaction, makes the rows' inserts one at a time;
        -- a reservation that cannot take it passes the key over, as SKIP
        -- LOCKED does.
        IF s IS NOT NULL AND pg_try_advisory_xact_lock(pgwake.key_rate_lock(claim_queue, k)) THEN
            INSERT INTO pgwake.key_rate_slots AS y (queue, limit_key, slot, last_start)
            VALUES (claim_queue, k, s, now())
            ON CONFLICT DO NOTHING;
            IF FOUND THEN
                slot := s;
                next_free := NULL;
                RETURN NEXT;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- Every slot holds an admission younger than a window (or another
    -- reservation has it locked this instant).
    slot := NULL;
    next_free := coalesce((SELECT min(y.last_start) + win FROM pgwake.key_rate_slots y
                           WHERE y.queue = claim_queue AND y.limit_key = k AND y.slot <= cnt
                             AND y.last_start > now() - win),
                          now() + win);
    RETURN NEXT;
END
$$;

-- Admissions for a claim of `claim_queue` under its per-key rate (migration
-- 0021; ARCHITECTURE.md → "Rate limits per key"), taken in their own
-- autocommit statement just before the claim (src/db/sql/key_rate_reserve.sql).
-- At most `wanted` in all; with `only_job`, one for that job's key (the
-- one-job claim of a suspect; its queue replaces `claim_queue`).
--
-- Visits the keys of the queue's ready jobs in the claim's rotation (the
-- keys after `after_key`, the last key this worker served, then from the
-- first up to it: pgwake.fair_key_jobs serves them in that order) and takes
-- one admission per key per pass, never more for a key than it has ready
-- jobs this worker can take (`only_tasks`, `never_tasks`), until `wanted`
-- are taken or a pass takes none. The claim then takes at most as many jobs
-- of each key as it was admitted (`keys`, one entry per admission) and gives
-- back the rest (src/db/sql/key_rate_release.sql). It also stops once
-- pgwake.key_walk_bound() keys were passed over (visited without an
-- admission taken: at their rate, or without a job this worker can take),
-- and then returns the last key it visited (`stop_key`): the worker's
-- rotation resumes after it, whatever the claim then takes.
--
-- Returns: the queue, whether it has a per-key rate (false: claim without
-- admissions), the keys and slots admitted, their admission time, when
-- the next admission of a key that had ready jobs but no free slot frees
-- (NULL: none was refused; keys after `stop_key` were not looked at), and
-- the key the walk stopped at (NULL: it did not reach the bound).
CREATE OR REPLACE FUNCTION pgwake.reserve_key_admissions(
    claim_queue text, after_key text, wanted bigint, only_tasks text[], never_tasks text[],
    only_job bigint DEFAULT NULL)
RETURNS TABLE (queue_name text, rated boolean, keys text[], slots integer[],
               admitted_at timestamptz, next_free timestamptz, stop_key text)
LANGUAGE plpgsql VOLATILE
SET enable_sort = off
SET jit = off
AS $$
#variable_conflict use_variable
DECLARE
    cnt integer;
    win interval;
    is_paused boolean;
    job_key text;
    k text;
    part integer;
    took boolean;
    n_k bigint;
    t record;
    bound integer := pgwake.key_walk_bound();
    passed integer := 0;
    prev text;
BEGIN
    keys := '{}';
    slots := '{}';
    admitted_at := now();
    next_free := NULL;
    stop_key := NULL;
    IF only_job IS NOT NULL THEN
        SELECT x.queue, x.limit_key INTO claim_queue, job_key FROM pgwake.jobs x
        WHERE x.id = only_job AND x.run_at <= now() AND NOT x.held;
    END IF;
    queue_name := claim_queue;
    SELECT q.key_rate_count, q.key_rate_window, q.paused INTO cnt, win, is_paused
    FROM pgwake.queues q WHERE q.name = claim_queue;
    rated := cnt IS NOT NULL;
    IF NOT rated OR is_paused OR coalesce(wanted, 0) < 1 THEN
        RETURN NEXT;
        RETURN;
    END IF;
    -- Rows idle for a window and a minute hold no admission any window
    -- could count: a few go each time (a key that comes back gets new ones).
    DELETE FROM pgwake.key_rate_slots s
    WHERE (s.queue, s.limit_key, s.slot) IN (
        SELECT y.queue, y.limit_key, y.slot FROM pgwake.key_rate_slots y
        WHERE y.queue = claim_queue AND y.last_start < now() - win - interval '1 minute'
        LIMIT 64
        FOR UPDATE OF y SKIP LOCKED);
    IF only_job IS NOT NULL THEN
        IF job_key IS NOT NULL THEN
            SELECT * INTO t FROM pgwake.take_key_admission(claim_queue, job_key, cnt, win);
            IF t.slot IS NOT NULL THEN
                keys := ARRAY[job_key];
                slots := ARRAY[t.slot];
            ELSE
                next_free := t.next_free;
            END IF;
        END IF;
        RETURN NEXT;
        RETURN;
    END IF;
    LOOP
        took := false;
        -- part 1: keys after after_key; 2: keys from the first up to it.
        FOR part IN 1..2 LOOP
            IF part = 2 AND after_key IS NULL THEN
                CONTINUE;
            END IF;
            k := CASE WHEN part = 1 THEN after_key END;
            LOOP
                -- The next key of a ready-or-scheduled job (skip scan of
                -- jobs_limit_key_ready_idx). Two statements, not `k IS
                -- NULL OR limit_key > k`: PL/pgSQL's generic plan of that
                -- cannot bound the index scan by k, and walked every keyed
                -- job of the queue for each key (1,000 keys all at their
                -- rate: 2.8 s a reservation).
                IF k IS NULL THEN
                    SELECT x.limit_key INTO k FROM pgwake.jobs x
                    WHERE x.queue = claim_queue AND x.limit_key IS NOT NULL AND NOT x.held
                    ORDER BY x.queue, x.limit_key COLLATE "C"
                    LIMIT 1;
                ELSE
                    SELECT x.limit_key INTO k FROM pgwake.jobs x
                    WHERE x.queue = claim_queue AND x.limit_key IS NOT NULL AND NOT x.held
                      AND x.limit_key COLLATE "C" > k
                    ORDER BY x.queue, x.limit_key COLLATE "C"
                    LIMIT 1;
                END IF;
                EXIT WHEN NOT FOUND;
                EXIT WHEN part = 2 AND k COLLATE "C" > after_key;
                -- The bound: `bound` keys passed over (visited without an
                -- admission taken) end the reservation before this one;
                -- the last key visited is returned (`stop_key`), and the
                -- worker's rotation resumes after it.
                IF passed >= bound THEN
                    stop_key := prev;
                    RETURN NEXT;
                    RETURN;
                END IF;
                prev := k;
                passed := passed + 1;
                n_k := (SELECT count(*) FROM unnest(keys) a(ak) WHERE ak = k);
                -- More ready jobs of the key than admissions taken for it.
                CONTINUE WHEN (SELECT count(*) FROM (
                                   SELECT FROM pgwake.jobs x
                                   WHERE x.queue = claim_queue AND x.limit_key COLLATE "C" = k
                                     AND NOT x.held AND x.run_at <= now()
                                     AND (only_tasks IS NULL OR x.task = ANY(only_tasks))
                                     AND x.task <> ALL(never_tasks)
                                   LIMIT n_k + 1) r) <= n_k;
                SELECT * INTO t FROM pgwake.take_key_admission(claim_queue, k, cnt, win);
                IF t.slot IS NULL THEN
                    next_free := least(next_free, t.next_free);
                    CONTINUE;
                END IF;
                passed := passed - 1;
                keys := keys || k;
                slots := slots || t.slot;
                took := true;
                IF cardinality(keys) >= wanted THEN
                    RETURN NEXT;
                    RETURN;
                END IF;
            END LOOP;
        END LOOP;
        EXIT WHEN NOT took;
    END LOOP;
    RETURN NEXT;
END
$$;

-- A tx-mode batch's mark under pressure, unless one of its jobs is a
-- suspect (src/db/sql/batch_mark_by_job.sql says why and how). A function
-- so that the statement's plan is made once per session: the mark is sent
-- as the unnamed statement (pipelined with its BEGIN and COMMIT), and
-- planning the check each time cost more than running it (0.18 ms a
-- batch). enable_seqscan off: the check reads `by_job` marks by job through
-- their GIN index and the others through their partial b-tree (migration
-- 0036), whatever the table's size when the plan was made.
CREATE OR REPLACE FUNCTION pgwake.mark_batch(
    claim_xid text, ids bigint[], worker text, batch_queues text[],
    unslotted_queues text[], unslotted_keys text[])
RETURNS TABLE (token bigint, suspects bigint[])
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH suspect AS (
        -- Marks written under pressure: looked up by job (GIN).
        SELECT j.id FROM pgwake.tx_batches b, unnest(b.job_ids) AS j(id)
        WHERE b.by_job AND b.job_ids && ids AND j.id = ANY(ids)
          AND pg_xact_status(b.xid) IS DISTINCT FROM 'in progress'
        UNION
        -- Marks written before the worker saw the pressure: all read, a
        -- bounded number (their partial b-tree skips the by_job ones).
        SELECT j.id FROM pgwake.tx_batches b, unnest(b.job_ids) AS j(id)
        WHERE NOT b.by_job AND b.job_ids && ids AND j.id = ANY(ids)
          AND pg_xact_status(b.xid) IS DISTINCT FROM 'in progress'
        UNION
        SELECT a.job_id FROM pgwake.tx_attempts a WHERE a.job_id = ANY(ids)
    ),
    mark AS (
        INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id, queues, key_queues, limit_keys,
                                       by_job)
        SELECT claim_xid::xid8, ids, worker, batch_queues, unslotted_queues, unslotted_keys, true
        WHERE NOT EXISTS (SELECT FROM suspect)
        RETURNING tx_batches.token
    )
    SELECT (SELECT m.token FROM mark m), ARRAY(SELECT s.id FROM suspect s ORDER BY s.id);
END
$$;
