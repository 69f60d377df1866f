-- Flows: a job waits for its parents (migration 0039; ARCHITECTURE.md →
-- "Flows: a child waits for its parents"; docs/src/flows.md).
--
-- A child is inserted with `parents_open` = its parents that have not
-- ended, and `held` while that is above zero. A parent's end is seen by
-- the deferred triggers *_release_children (only for a row with
-- `has_children`), at the commit of the transaction that ends it: tx mode
-- the claim transaction's commit, lease mode the completion statement. So
-- the last parent's end and its child's release commit together.
-- pgwake.settle_parent decides by where the parent is at that commit:
--   in jobs or leased_jobs   not ended (retried, leased): the flag is
--                            carried onto the row where it now is;
--   in dead_jobs             ended dead or cancelled: each child's policy;
--   nowhere                  ended done: its open edges end, children whose
--                            count reaches 0 are released.
-- pgwake.release_stalled_flows (the rescuer) settles the parents of held
-- children again, so a missed release (a child added while its parent
-- ran in tx mode) waits at most one rescuer interval.

-- The functions below that add parents and release children run with
-- `enable_seqscan = off`: every statement in them finds rows by key (a job
-- by id, edges by parent or by child), and a plan cached while the tables
-- were small, or chosen on the statistics a long transaction cannot
-- refresh, scanned pgwake.jobs or pgwake.job_parents whole once per child
-- added or per parent ended: quadratic in one transaction (10,000 children
-- of one parent took 16 s to enqueue and over a minute to release under
-- load; tests/jobs/flows_scale.rs counts the scans). And with `jit = off`:
-- a plan that must scan a table without an index (the history settings,
-- read by a trigger these statements fire) is costed at the disabled
-- scan's penalty, past `jit_above_cost`, and compiling it took 50–200 ms
-- per statement (a 300-parent fan-in ending in one transaction: 16.6 s).

-- The largest number of parents one job may have.
CREATE OR REPLACE FUNCTION pgwake.max_parents() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;

-- End the edges of `parent_id` in `from_state` whose policy is one of
-- `policies` (NULL: any) as 'done', lower their children's counts and
-- release those that reach 0 (a keyed one through its key: the key's
-- release decides, functions/keys.sql). Returns how many were released.
CREATE OR REPLACE FUNCTION pgwake.end_parent_edges(parent_id bigint, from_state text, policies text[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    kids bigint[];
    released integer := 0;
    r record;
BEGIN
    WITH e AS (
        UPDATE pgwake.job_parents p SET state = 'done'
        WHERE p.parent = parent_id AND p.state = from_state
          AND (policies IS NULL OR p.on_failure = ANY(policies))
          -- a batch's edge is counted (pgwake.end_batch_edge)
          AND NOT p.batch
        RETURNING p.child
    )
    SELECT array_agg(e.child ORDER BY e.child) INTO kids FROM e;
    IF kids IS NULL THEN
        RETURN 0;
    END IF;
    -- Children locked in id order: two parents of the same children that
    -- end at once cannot deadlock.
    PERFORM 1 FROM pgwake.jobs j WHERE j.id = ANY(kids) ORDER BY j.id FOR UPDATE;
    FOR r IN
        WITH u AS (
            UPDATE pgwake.jobs j
            SET parents_open = greatest(j.parents_open - 1, 0),
                held = CASE WHEN j.parents_open - 1 > 0 THEN true
                            -- a keyed job stays held: its key releases it
                            ELSE j.held AND j.ordering_key IS NOT NULL END,
                -- The release, for its latency (migration 0045): the
                -- clock, not now(), which a tx-mode parent's claim
                -- transaction took before its handler ran.
                released_at = CASE WHEN j.parents_open - 1 > 0 THEN j.released_at
                                   ELSE clock_timestamp() END
            WHERE j.id = ANY(kids) AND j.parents_open > 0
            RETURNING j.parents_open, j.ordering_key, j.queue, j.run_at
        )
        SELECT u.ordering_key, u.queue, u.run_at FROM u WHERE u.parents_open = 0
    LOOP
        released := released + 1;
        IF r.ordering_key IS NOT NULL AND NOT pgwake.release_ordering_key(r.ordering_key) THEN
            INSERT INTO pgwake.ordering_recheck (ordering_key) VALUES (r.ordering_key);
        END IF;
        -- Wake the queue's idle workers, as an insert does (functions/
        -- notify.sql): a worker that waits on LISTEN would otherwise find
        -- the child only at its next poll. Repeats within a transaction
        -- are sent once.
        IF r.run_at <= now() THEN
            PERFORM pg_notify('pgwake', r.queue);
        END IF;
    END LOOP;
    RETURN released;
END
$$;

-- Cancel the waiting children of `parent_id` held by an edge in state
-- 'failed' with policy 'cancel': each moves to dead_jobs as cancelled
-- (last_error 'cancelled', the reason in its recorded errors), and its own
-- children follow by their policies at the same commit (its row has
-- has_children, so its delete fires the trigger again).
CREATE OR REPLACE FUNCTION pgwake.cancel_children(parent_id bigint, reason text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    moved integer;
BEGIN
    WITH taken AS (
        DELETE FROM pgwake.jobs
        WHERE id IN (SELECT j.id FROM pgwake.jobs j
                     JOIN pgwake.job_parents p ON p.child = j.id
                     WHERE p.parent = parent_id AND p.state = 'failed' AND p.on_failure = 'cancel'
                     ORDER BY j.id FOR UPDATE OF j)
        RETURNING *
    ), buried AS (
        INSERT INTO pgwake.dead_jobs
            (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
             created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
        SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, 'cancelled',
               created_at, timeout, ordering_key, unique_key, ordering_at, limit_key
        FROM taken
        ON CONFLICT (id) DO UPDATE SET last_error = excluded.last_error, failed_at = now()
        RETURNING id, attempts
    )
    INSERT INTO pgwake.job_errors AS e (job_id, attempt, error)
    SELECT b.id, b.attempts, reason FROM buried b
    ON CONFLICT (job_id, attempt) DO UPDATE SET error = excluded.error, at = now();
    GET DIAGNOSTICS moved = ROW_COUNT;
    RETURN moved;
END
$$;

-- Apply the end (or not) of `parent_id` to its children. Returns how many
-- children were released.
CREATE OR REPLACE FUNCTION pgwake.settle_parent(parent_id bigint) RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    err text;
    released integer;
BEGIN
    -- Not ended: back in the queue (a retry) or moved by a lease claim.
    -- The flag goes where the row is, so that its end fires the trigger.
    IF EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = parent_id) THEN
        UPDATE pgwake.jobs SET has_children = true
        WHERE ctid = ANY(ARRAY(SELECT j.ctid FROM pgwake.jobs j
                               WHERE j.id = parent_id AND NOT j.has_children
                               FOR UPDATE SKIP LOCKED));
        -- A parent retried by `pgwake dead retry`: its failure's marks
        -- are undone; its children wait for this run.
        UPDATE pgwake.job_parents SET state = 'open'
        WHERE parent = parent_id AND state = 'failed' AND on_failure = 'wait';
        RETURN 0;
    END IF;
    IF EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = parent_id) THEN
        UPDATE pgwake.leased_jobs SET has_children = true
        WHERE id = parent_id AND NOT has_children;
        RETURN 0;
    END IF;
    SELECT d.last_error INTO err FROM pgwake.dead_jobs d WHERE d.id = parent_id;
    IF FOUND THEN
        -- 'run': as if done, the child seeing the parent's error
        -- (pgwake.parent_results); 'wait' and 'cancel': marked failed.
        UPDATE pgwake.job_parents SET error = coalesce(err, 'dead'), result = NULL
        WHERE parent = parent_id AND state = 'open' AND on_failure = 'run';
        PERFORM pgwake.end_batch_edge(parent_id);
        released := pgwake.end_parent_edges(parent_id, 'open', ARRAY['run']);
        UPDATE pgwake.job_parents SET state = 'failed'
        WHERE parent = parent_id AND state = 'open';
        PERFORM pgwake.cancel_children(parent_id,
            format('cancelled: parent %s ended %s', parent_id,
                   CASE WHEN err = 'cancelled' THEN 'cancelled' ELSE 'dead' END));
        RETURN released;
    END IF;
    -- Gone: ended done. (A parent that ended dead and was purged since
    -- has edges marked 'failed': its waiting children are cancelled.)
    UPDATE pgwake.job_parents SET on_failure = 'cancel'
    WHERE parent = parent_id AND state = 'failed' AND on_failure = 'wait';
    PERFORM pgwake.cancel_children(parent_id,
        format('cancelled: parent %s ended dead and was purged', parent_id));
    PERFORM pgwake.end_batch_edge(parent_id);
    RETURN pgwake.end_parent_edges(parent_id, 'open', NULL);
END
$$;

CREATE OR REPLACE FUNCTION pgwake.release_children_trigger() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    PERFORM pgwake.settle_parent(OLD.id);
    RETURN NULL;
END
$$;

-- Add the edges of a new job `child_id` to `parents` (the job was just
-- inserted by this transaction). Refuses, before any change, an unknown
-- parent, one that ended dead or cancelled, and one that ended and that
-- the history does not show done; a parent the history shows done counts
-- as ended. Holds the child when a parent is open. Returns how many are open.
CREATE OR REPLACE FUNCTION pgwake.add_parents(child_id bigint, parents bigint[], on_failure text)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    p bigint;
    wanted bigint[];
    open_ids bigint[] := '{}';
    done_ids bigint[] := '{}';
    last_id bigint;
BEGIN
    IF cardinality(parents) > pgwake.max_parents() THEN
        RAISE EXCEPTION 'pgwake: a job with % parents: at most % are allowed',
            cardinality(parents), pgwake.max_parents()
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Wait for a few jobs that themselves wait for the rest (a tree of fan-ins), or for one job that ends last.';
    END IF;
    IF coalesce(on_failure, 'cancel') NOT IN ('cancel', 'run', 'wait') THEN
        RAISE EXCEPTION 'pgwake: on_parent_failure %: expected cancel, run or wait', to_jsonb(on_failure)::text
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Only a job this transaction just enqueued (its created_at is this
    -- transaction's now()) and that has no parents yet: a producer, who may
    -- call this function, cannot hold someone else's waiting job.
    IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j
                   WHERE j.id = child_id AND j.created_at = now() AND j.parents_open = 0
                     AND NOT EXISTS (SELECT 1 FROM pgwake.job_parents e WHERE e.child = child_id)) THEN
        RAISE EXCEPTION 'pgwake: job % was not enqueued by this transaction: parents are given when a job is enqueued', child_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT array_agg(DISTINCT x ORDER BY x) INTO wanted FROM unnest(parents) x WHERE x IS NOT NULL;
    IF wanted IS NULL THEN
        RETURN 0;
    END IF;
    IF child_id = ANY(wanted) THEN
        RAISE EXCEPTION 'pgwake: job % cannot wait for itself', child_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    last_id := coalesce(pg_sequence_last_value(pg_get_serial_sequence('pgwake.jobs', 'id')::regclass), 0);
    FOREACH p IN ARRAY wanted LOOP
        IF EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = p)
           OR EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = p) THEN
            open_ids := open_ids || p;
        ELSIF EXISTS (SELECT 1 FROM pgwake.dead_jobs d WHERE d.id = p) THEN
            RAISE EXCEPTION 'pgwake: parent job % ended dead or cancelled: a child would never run', p
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Retry the parent first (pgwake dead retry ' || p || '), or leave it out of the parents.';
        ELSIF EXISTS (SELECT 1 FROM pgwake.finished_jobs f WHERE f.id = p AND f.outcome = 'done') THEN
            done_ids := done_ids || p;
        ELSIF p > 0 AND p <= last_id THEN
            RAISE EXCEPTION 'pgwake: parent job % already ended, and the history does not show it done', p
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'Enqueue the child in the same transaction as its parents, or keep history (pgwake run --keep-finished) so that a parent that ended done counts as done.';
        ELSE
            RAISE EXCEPTION 'pgwake: parent job % does not exist', p
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    INSERT INTO pgwake.job_parents (parent, child, on_failure, state)
    SELECT x, child_id, coalesce(on_failure, 'cancel'), 'open' FROM unnest(open_ids) x
    UNION ALL
    SELECT x, child_id, coalesce(on_failure, 'cancel'), 'done' FROM unnest(done_ids) x;
    IF cardinality(open_ids) = 0 THEN
        RETURN 0;
    END IF;
    UPDATE pgwake.jobs SET parents_open = cardinality(open_ids), held = true WHERE id = child_id;
    -- Flag the parents. A waiting parent that a tx-mode claim holds (it is
    -- running) is skipped, not waited for: its end cannot see this child,
    -- and the rescuer's sweep releases the child (release_stalled_flows).
    -- A leased parent's row is locked to this commit: its completion waits
    -- for it and then fires the trigger.
    UPDATE pgwake.jobs SET has_children = true
    WHERE ctid = ANY(ARRAY(SELECT j.ctid FROM pgwake.jobs j
                           WHERE j.id = ANY(open_ids) AND NOT j.has_children
                           FOR UPDATE SKIP LOCKED));
    UPDATE pgwake.leased_jobs SET has_children = true
    WHERE id = ANY(open_ids) AND NOT has_children;
    RETURN cardinality(open_ids);
END
$$;

-- The rescuer's sweep (src/db/sql/release_flows.sql): settles again the
-- parents of up to `batch` held children, from after child id `after`
-- (NULL: the first); a parent that is waiting or running is left alone.
-- Returns the children released (each one a missed release) and the id to
-- go on from (NULL: the sweep reached the end).
CREATE OR REPLACE FUNCTION pgwake.release_stalled_flows(after bigint, batch bigint,
    OUT released bigint, OUT next_after bigint)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    p bigint;
    seen bigint;
BEGIN
    released := 0;
    -- Walked by the edges (job_parents_child_idx), not the queue.
    SELECT max(c.child), count(*) INTO next_after, seen
    FROM (SELECT DISTINCT e.child FROM pgwake.job_parents e
          WHERE e.state <> 'done' AND NOT e.batch AND (after IS NULL OR e.child > after)
          ORDER BY e.child LIMIT release_stalled_flows.batch) c;
    FOR p IN
        SELECT DISTINCT e.parent FROM pgwake.job_parents e
        WHERE e.state <> 'done' AND (after IS NULL OR e.child > after) AND e.child <= next_after
          AND NOT e.batch
          AND EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = e.child AND j.parents_open > 0)
          AND NOT EXISTS (SELECT 1 FROM pgwake.jobs w WHERE w.id = e.parent)
          AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = e.parent)
    LOOP
        released := released + pgwake.settle_parent(p);
    END LOOP;
    -- Edges of children that left the queue (ran, or were cancelled).
    DELETE FROM pgwake.job_parents e
    WHERE e.ctid = ANY(ARRAY(
        SELECT x.ctid FROM pgwake.job_parents x
        WHERE NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = x.child)
          AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = x.child)
          AND NOT EXISTS (SELECT 1 FROM pgwake.dead_jobs d WHERE d.id = x.child)
        LIMIT release_stalled_flows.batch));
    IF seen < release_stalled_flows.batch THEN
        next_after := NULL;
    END IF;
    -- Batches: close those left open past their close_by (the callback
    -- runs with what was added), release any closed one whose jobs have
    -- all ended (none is missed: this is a net), and forget those whose
    -- callback is gone from the queue, the dead jobs and the history, a
    -- day after their release (pgwake batch status answers until then).
    PERFORM pgwake.close_batch(b.id, 'timeout')
    FROM (SELECT x.id FROM pgwake.batches x
          WHERE x.closed_at IS NULL AND x.close_by < now()
          ORDER BY x.close_by LIMIT release_stalled_flows.batch) b;
    PERFORM pgwake.release_batch(b.id)
    FROM (SELECT x.id FROM pgwake.batches x
          WHERE x.closed_at IS NOT NULL AND x.released_at IS NULL AND x.ended >= x.added
          LIMIT release_stalled_flows.batch FOR UPDATE SKIP LOCKED) b;
    DELETE FROM pgwake.batches x
    WHERE x.id = ANY(ARRAY(
        SELECT y.id FROM pgwake.batches y
        WHERE (y.released_at IS NULL OR y.released_at < now() - interval '1 day')
          AND NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = y.id)
          AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = y.id)
          AND NOT EXISTS (SELECT 1 FROM pgwake.dead_jobs d WHERE d.id = y.id)
          AND NOT EXISTS (SELECT 1 FROM pgwake.finished_jobs f WHERE f.id = y.id)
        LIMIT release_stalled_flows.batch));
END
$$;

-- Enqueue a whole graph in one call:
--   SELECT pgwake.flow('[{"name": "a", "task": "fetch"},
--                        {"name": "b", "task": "fetch"},
--                        {"name": "c", "task": "merge", "after": ["a", "b"]}]');
-- returns {"a": 41, "b": 42, "c": 43}. Each node: `name` (unique in the
-- call, at most 128 bytes) and `task` (required); `payload`, `queue`,
-- `priority`, `run_at`, `max_attempts`, `ordering_key`, `limit_key`,
-- `on_parent_failure` as pgwake.enqueue takes them; `after`: names of nodes
-- of this call, or ids of existing jobs. At most 10,000 nodes. Nodes are
-- inserted parents first; a cycle is refused with its names, a malformed
-- node with its index and name, and then nothing is inserted.
CREATE OR REPLACE FUNCTION pgwake.flow(nodes jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    n integer;
    node jsonb;
    nm text;
    i integer;
    k integer;
    pos jsonb := '{}';
    names text[] := '{}';
    indeg integer[];
    ep integer[];
    ec integer[];
    first_edge integer[];
    queue integer[] := '{}';
    head integer := 1;
    u integer;
    dep jsonb;
    ids jsonb := '{}';
    parent_ids bigint[];
    path text[];
    seen jsonb;
    unknown text;
BEGIN
    IF jsonb_typeof(nodes) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'pgwake.flow: expected a JSON array of nodes, got %', coalesce(jsonb_typeof(nodes), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    n := jsonb_array_length(nodes);
    IF n > 10000 THEN
        RAISE EXCEPTION 'pgwake.flow: % nodes: at most 10000 are allowed in one call', n
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Split the graph: a later call can name the jobs of an earlier one by id in "after".';
    END IF;
    -- Each node well-formed, names unique.
    FOR i IN 1..n LOOP
        node := nodes -> (i - 1);
        nm := CASE WHEN jsonb_typeof(node -> 'name') = 'string' THEN node ->> 'name' END;
        IF jsonb_typeof(node) IS DISTINCT FROM 'object' THEN
            RAISE EXCEPTION 'pgwake.flow: node % is not a JSON object', i - 1
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF nm IS NULL OR nm = '' OR octet_length(nm) > 128 THEN
            RAISE EXCEPTION 'pgwake.flow: node % needs a "name": a string of 1 to 128 bytes', i - 1
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF pos ? nm THEN
            RAISE EXCEPTION 'pgwake.flow: node % (name %): the name is already used by node %',
                i - 1, to_jsonb(nm)::text, (pos ->> nm)::integer - 1
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF jsonb_typeof(node -> 'task') IS DISTINCT FROM 'string' THEN
            RAISE EXCEPTION 'pgwake.flow: node % (name %) needs a "task" string', i - 1, to_jsonb(nm)::text
                USING ERRCODE = 'invalid_parameter_value';
        ELSIF node ? 'after' AND jsonb_typeof(node -> 'after') IS DISTINCT FROM 'array' THEN
            RAISE EXCEPTION 'pgwake.flow: node % (name %): "after" must be an array of names and job ids',
                i - 1, to_jsonb(nm)::text
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT string_agg(to_jsonb(x)::text, ', ') INTO unknown FROM jsonb_object_keys(node) x
        WHERE x NOT IN ('name', 'task', 'payload', 'queue', 'priority', 'run_at', 'max_attempts',
                        'ordering_key', 'limit_key', 'after', 'on_parent_failure');
        IF unknown IS NOT NULL THEN
            RAISE EXCEPTION 'pgwake.flow: node % (name %): unknown field %', i - 1, to_jsonb(nm)::text, unknown
                USING ERRCODE = 'invalid_parameter_value',
                      HINT = 'A node takes name, task, payload, queue, priority, run_at, max_attempts, ordering_key, limit_key, after, on_parent_failure.';
        END IF;
        pos := pos || jsonb_build_object(nm, i);
        names := names || nm;
    END LOOP;
    -- Local edges, checked, sorted by parent.
    FOR i IN 1..n LOOP
        FOR dep IN SELECT * FROM jsonb_array_elements(coalesce(nodes -> (i - 1) -> 'after', '[]')) LOOP
            IF jsonb_typeof(dep) = 'string' THEN
                IF NOT pos ? (dep #>> '{}') THEN
                    RAISE EXCEPTION 'pgwake.flow: node % (name %): "after" names %, which is no node of this flow',
                        i - 1, to_jsonb(names[i])::text, dep::text
                        USING ERRCODE = 'invalid_parameter_value';
                END IF;
            ELSIF jsonb_typeof(dep) <> 'number' OR (dep #>> '{}') !~ '^[0-9]{1,18}$' THEN
                RAISE EXCEPTION 'pgwake.flow: node % (name %): "after" holds %: expected a node name or a job id',
                    i - 1, to_jsonb(names[i])::text, left(dep::text, 64)
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
        END LOOP;
    END LOOP;
    SELECT coalesce(array_agg(p ORDER BY p, c), '{}'), coalesce(array_agg(c ORDER BY p, c), '{}')
    INTO ep, ec
    FROM (SELECT DISTINCT (pos ->> (d #>> '{}'))::integer AS p, x.i::integer AS c
          FROM jsonb_array_elements(nodes) WITH ORDINALITY x(node, i),
               jsonb_array_elements(coalesce(x.node -> 'after', '[]')) d
          WHERE jsonb_typeof(d) = 'string') e;
    indeg := array_fill(0, ARRAY[n]);
    first_edge := array_fill(0, ARRAY[n + 1]);
    FOR k IN 1..coalesce(cardinality(ec), 0) LOOP
        indeg[ec[k]] := indeg[ec[k]] + 1;
    END LOOP;
    -- first_edge[p]: the first edge of parent p; edges of p up to first_edge[p+1]-1.
    k := 1;
    FOR i IN 1..n + 1 LOOP
        WHILE k <= cardinality(ep) AND ep[k] < i LOOP
            k := k + 1;
        END LOOP;
        first_edge[i] := k;
    END LOOP;
    FOR i IN 1..n LOOP
        IF indeg[i] = 0 THEN
            queue := queue || i;
        END IF;
    END LOOP;
    WHILE head <= cardinality(queue) LOOP
        u := queue[head];
        head := head + 1;
        FOR k IN first_edge[u]..first_edge[u + 1] - 1 LOOP
            indeg[ec[k]] := indeg[ec[k]] - 1;
            IF indeg[ec[k]] = 0 THEN
                queue := queue || ec[k];
            END IF;
        END LOOP;
    END LOOP;
    IF cardinality(queue) < n THEN
        -- A cycle: every node left has a parent left. Walk up until a name
        -- comes back.
        SELECT min(x) INTO u FROM generate_subscripts(indeg, 1) x WHERE indeg[x] > 0;
        path := '{}';
        seen := '{}';
        WHILE NOT seen ? names[u] LOOP
            seen := seen || jsonb_build_object(names[u], cardinality(path) + 1);
            path := path || names[u];
            SELECT (pos ->> (d #>> '{}'))::integer INTO u
            FROM jsonb_array_elements(nodes -> (u - 1) -> 'after') d
            WHERE jsonb_typeof(d) = 'string' AND indeg[(pos ->> (d #>> '{}'))::integer] > 0
            LIMIT 1;
        END LOOP;
        path := path[(seen ->> names[u])::integer:] || names[u];
        RAISE EXCEPTION 'pgwake.flow: the graph has a cycle: %',
            (SELECT string_agg(to_jsonb(x)::text, ' waits for ') FROM unnest(path) x)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A job can only wait for jobs that do not wait for it.';
    END IF;
    FOREACH u IN ARRAY queue LOOP
        node := nodes -> (u - 1);
        SELECT array_agg(CASE WHEN jsonb_typeof(d) = 'string' THEN (ids ->> (d #>> '{}'))::bigint
                              ELSE (d #>> '{}')::bigint END)
        INTO parent_ids
        FROM jsonb_array_elements(coalesce(node -> 'after', '[]')) d;
        ids := ids || jsonb_build_object(names[u], pgwake.enqueue(
            node ->> 'task',
            coalesce(node -> 'payload', '{}'),
            coalesce(node ->> 'queue', 'default'),
            coalesce((node ->> 'run_at')::timestamptz, now()),
            coalesce((node ->> 'priority')::integer, 0),
            coalesce((node ->> 'max_attempts')::integer, 25),
            ordering_key => node ->> 'ordering_key',
            limit_key => node ->> 'limit_key',
            after => parent_ids,
            on_parent_failure => node ->> 'on_parent_failure'));
    END LOOP;
    RETURN ids;
END
$$;

-- `pgwake dead retry` of `parent_id` (src/db/sql/dead_retry.sql, for each
-- job it brings back): what the parent's failure did is undone. Children
-- that wait for its retry ('wait') wait for the new run; children its
-- failure cancelled ('cancel': in dead_jobs as cancelled) come back held,
-- waiting for it (and any other parent not done), and so do theirs, down
-- the graph. Children it released under 'run' have run or are running:
-- left alone. Returns whether the parent still has children (its row's
-- has_children).
CREATE OR REPLACE FUNCTION pgwake.revive_parent(parent_id bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    kid bigint;
BEGIN
    FOR kid IN
        SELECT e.child FROM pgwake.job_parents e
        JOIN pgwake.dead_jobs d ON d.id = e.child AND d.last_error = 'cancelled'
        WHERE e.parent = parent_id AND e.state = 'failed' AND e.on_failure = 'cancel'
        ORDER BY e.child
    LOOP
        UPDATE pgwake.job_parents SET state = 'open' WHERE parent = parent_id AND child = kid;
        WITH back AS (
            DELETE FROM pgwake.dead_jobs WHERE id = kid RETURNING *
        )
        INSERT INTO pgwake.jobs
            (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
             created_at, timeout, ordering_key, unique_key, ordering_at, limit_key,
             parents_open, held, has_children)
        SELECT id, queue, task, payload, priority, now(), 0, max_attempts, NULL, created_at,
               timeout, ordering_key, pgwake.requeued_unique_key(unique_key),
               coalesce(ordering_at, run_at), limit_key,
               greatest((SELECT count(*) FROM pgwake.job_parents e
                         WHERE e.child = kid AND e.state <> 'done'), 1),
               true, pgwake.revive_parent(kid)
        FROM back;
    END LOOP;
    UPDATE pgwake.job_parents SET state = 'open'
    WHERE parent = parent_id AND state = 'failed' AND on_failure = 'wait';
    RETURN EXISTS (SELECT 1 FROM pgwake.job_parents e WHERE e.parent = parent_id AND e.state <> 'done');
END
$$;


-- The most bytes of parents' results one child receives (1 MiB of JSON
-- text, summed over its parents in parent id order).
CREATE OR REPLACE FUNCTION pgwake.max_parent_results_bytes() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1048576 $$;

-- What job `child_id`'s parents left it (migration 0043; docs/src/flows.md
-- → "Results"): a JSON object with one member per parent that ended, keyed
-- by the parent's id as text:
--   {"result": <value>}   the parent ended done with a result (`null`
--                         when it returned none);
--   {"error": "<text>"}   the parent ended dead or cancelled and the child
--                         runs anyway (on_parent_failure 'run');
--   {"omitted": <bytes>}  the result would take the child past
--                         pgwake.max_parent_results_bytes(): it is left
--                         out, and its size said (read it from
--                         pgwake.job_parents).
-- A parent that ended before the child was enqueued (counted done from the
-- history) has {"result": <its history row's result>} when history kept it.
CREATE OR REPLACE FUNCTION pgwake.parent_results(child_id bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
    WITH e AS (
        SELECT e.parent, e.error,
               coalesce(e.result, (SELECT f.result FROM pgwake.finished_jobs f
                                   WHERE f.id = e.parent AND f.outcome = 'done'
                                   ORDER BY f.finished_at DESC LIMIT 1)) AS result
        FROM pgwake.job_parents e
        WHERE e.child = child_id AND e.state = 'done'
    ), sized AS (
        SELECT e.*, octet_length(e.result::text) AS bytes,
               sum(coalesce(octet_length(e.result::text), 0)) OVER (ORDER BY e.parent) AS running
        FROM e
    )
    SELECT coalesce(jsonb_object_agg(s.parent::text,
        CASE WHEN s.error IS NOT NULL THEN jsonb_build_object('error', s.error)
             WHEN s.running > pgwake.max_parent_results_bytes() THEN jsonb_build_object('omitted', s.bytes)
             ELSE jsonb_build_object('result', s.result) END), '{}')
    FROM sized s
$$;
REVOKE EXECUTE ON FUNCTION pgwake.parent_results(bigint) FROM PUBLIC;

-- Batches (migration 0044; docs/src/flows.md → "Batches"): a callback job
-- that is a child of every job of the batch under the `run` policy, held
-- while the batch is open and until every job of it has ended, whatever
-- their outcomes. The batch's id is its callback's job id.
--
--   b := pgwake.batch_open('report', '{"import": 7}');  -- the callback, held
--   PERFORM pgwake.enqueue('row', ..., batch => b);      -- any number of transactions
--   PERFORM pgwake.batch_close(b);                       -- no more jobs
--   SELECT pgwake.batch_status(b);                       -- counts by outcome
--
-- Counted, not decremented: a job's end marks its own edge (a row of its
-- own) and adds 1 to its transaction's count for the batch, kept in the
-- transaction-local setting pgwake.batch_counts ({"<batch>": [added,
-- ended]}); the first add or end of a batch in a transaction inserts a row
-- into pgwake.batch_checks, whose deferred trigger runs after every other
-- end of the commit and applies the counts to pgwake.batches in one
-- UPDATE. So a transaction that ends 10,000 jobs of a batch updates the
-- batch's row once (not 10,000 times: quadratic in one transaction), and
-- workers ending jobs of one batch meet on its row once per transaction,
-- at commit. That UPDATE's row lock orders them: whichever brings `ended`
-- to `added` on a closed batch releases the callback, in its commit.

-- The most jobs one batch may have.
CREATE OR REPLACE FUNCTION pgwake.max_batch_jobs() RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 100000::bigint $$;

-- The most failed job ids pgwake.batch_status lists.
CREATE OR REPLACE FUNCTION pgwake.max_batch_failed_ids() RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT 1000 $$;

-- Refuse `id` unless it is a batch: a clear error for an id that is no
-- job, or a job that is not a batch's callback.
CREATE OR REPLACE FUNCTION pgwake.batch_row(id bigint, lock boolean) RETURNS pgwake.batches
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r pgwake.batches;
BEGIN
    IF lock THEN
        SELECT * INTO r FROM pgwake.batches b WHERE b.id = batch_row.id FOR UPDATE;
    ELSE
        SELECT * INTO r FROM pgwake.batches b WHERE b.id = batch_row.id;
    END IF;
    IF r.id IS NOT NULL THEN
        RETURN r;
    END IF;
    IF EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = batch_row.id)
       OR EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = batch_row.id)
       OR EXISTS (SELECT 1 FROM pgwake.dead_jobs d WHERE d.id = batch_row.id) THEN
        RAISE EXCEPTION 'pgwake: job % is not a batch', batch_row.id
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A batch''s id is the id pgwake.batch_open returned (its callback''s job id).';
    END IF;
    RAISE EXCEPTION 'pgwake: batch % does not exist', batch_row.id
        USING ERRCODE = 'invalid_parameter_value',
              HINT = 'A batch''s id is the id pgwake.batch_open returned; a batch is forgotten a day after its callback was released, once the callback has left the queue and the history.';
END
$$;

-- Add `added` and `ended` to this transaction's counts for batch `b`,
-- queueing its check at commit the first time.
CREATE OR REPLACE FUNCTION pgwake.batch_count(b bigint, added bigint, ended bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    cur jsonb := coalesce(nullif(current_setting('pgwake.batch_counts', true), ''), '{}')::jsonb;
    e jsonb := cur -> b::text;
    first boolean := e IS NULL;
BEGIN
    e := jsonb_build_array(coalesce((e ->> 0)::bigint, 0) + added, coalesce((e ->> 1)::bigint, 0) + ended);
    PERFORM set_config('pgwake.batch_counts', jsonb_set(cur, ARRAY[b::text], e)::text, true);
    -- After the setting: under SET CONSTRAINTS ALL IMMEDIATE the check
    -- runs at the end of this INSERT, and reads it.
    IF first THEN
        INSERT INTO pgwake.batch_checks (batch) VALUES (b);
    END IF;
    RETURN (e ->> 0)::bigint;
END
$$;

-- Apply this transaction's counts for batch `b` to its row (one UPDATE,
-- whose row lock orders the transactions of a batch), refusing adds to a
-- batch another transaction closed meanwhile or past the bound, and
-- release the callback if the batch is closed and every job has ended.
CREATE OR REPLACE FUNCTION pgwake.batch_apply(b bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    cur jsonb := coalesce(nullif(current_setting('pgwake.batch_counts', true), ''), '{}')::jsonb;
    e jsonb := cur -> b::text;
    r pgwake.batches;
BEGIN
    IF e IS NULL THEN
        RETURN;
    END IF;
    PERFORM set_config('pgwake.batch_counts', (cur - b::text)::text, true);
    DELETE FROM pgwake.batch_checks c WHERE c.batch = b;
    UPDATE pgwake.batches x SET added = x.added + (e ->> 0)::bigint, ended = x.ended + (e ->> 1)::bigint
    WHERE x.id = b
    RETURNING * INTO r;
    IF r.id IS NULL THEN
        RETURN;
    END IF;
    IF (e ->> 0)::bigint > 0 AND r.closed_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgwake: batch % was closed (at %) before this transaction committed: its % jobs were not added',
            b, r.closed_at, (e ->> 0)::bigint
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Close a batch after its last job is added, or open a new batch for these jobs.';
    END IF;
    IF r.added > pgwake.max_batch_jobs() THEN
        RAISE EXCEPTION 'pgwake: batch % would have % jobs: at most % are allowed', b, r.added, pgwake.max_batch_jobs()
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Split the work into several batches, and wait for them with a job enqueued after their callbacks.';
    END IF;
    IF r.closed_at IS NOT NULL AND r.released_at IS NULL AND r.ended >= r.added THEN
        PERFORM pgwake.release_batch(b);
    END IF;
END
$$;

-- The first check of a commit applies every batch the transaction touched,
-- in batch id order (the later checks find nothing left): two commits
-- that end jobs of the same batches lock their rows in the same order,
-- and cannot deadlock. The checks are queued after the parents' ends, so
-- by the first one every end of the commit is counted.
CREATE OR REPLACE FUNCTION pgwake.batch_check_trigger() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    b bigint;
BEGIN
    FOR b IN
        SELECT k::bigint
        FROM jsonb_object_keys(coalesce(nullif(current_setting('pgwake.batch_counts', true), ''), '{}')::jsonb) k
        ORDER BY 1
    LOOP
        PERFORM pgwake.batch_apply(b);
    END LOOP;
    RETURN NULL;
END
$$;

-- Batch `b`'s jobs by outcome, read from its edges: total, done, dead,
-- cancelled, pending, and the ids of the failed (dead or cancelled), the
-- first pgwake.max_batch_failed_ids() by id (failed_ids_omitted: how many
-- more). One pass over the batch's edges by job_parents_child_idx.
CREATE OR REPLACE FUNCTION pgwake.batch_summary(b bigint) RETURNS jsonb
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
    WITH c AS (
        SELECT count(*) AS total,
               count(*) FILTER (WHERE e.state = 'done' AND e.error IS NULL) AS done,
               count(*) FILTER (WHERE e.state = 'done' AND e.error = 'cancelled') AS cancelled,
               count(*) FILTER (WHERE e.state = 'done' AND e.error <> 'cancelled') AS dead,
               count(*) FILTER (WHERE e.state <> 'done') AS pending
        FROM pgwake.job_parents e WHERE e.child = b AND e.batch
    ), f AS (
        SELECT coalesce(jsonb_agg(x.parent ORDER BY x.parent), '[]') AS ids
        FROM (SELECT e.parent FROM pgwake.job_parents e
              WHERE e.child = b AND e.batch AND e.state = 'done' AND e.error IS NOT NULL
              ORDER BY e.parent LIMIT pgwake.max_batch_failed_ids()) x
    )
    SELECT jsonb_build_object('total', c.total, 'done', c.done, 'dead', c.dead,
                              'cancelled', c.cancelled, 'pending', c.pending,
                              'failed_ids', f.ids,
                              'failed_ids_omitted', c.dead + c.cancelled - jsonb_array_length(f.ids))
    FROM c, f
$$;

-- Release batch `b`'s callback (every job ended, the batch closed): the
-- summary is kept on the batch's row, the callback made claimable (a keyed
-- one through its key), its queue's idle workers woken.
CREATE OR REPLACE FUNCTION pgwake.release_batch(b bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r record;
BEGIN
    UPDATE pgwake.batches x SET released_at = now(), summary = pgwake.batch_summary(b)
    WHERE x.id = b AND x.released_at IS NULL;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    UPDATE pgwake.jobs j
    SET parents_open = 0, held = j.held AND j.ordering_key IS NOT NULL,
        -- for the release latency, as end_parent_edges (migration 0045)
        released_at = clock_timestamp()
    WHERE j.id = b AND j.parents_open > 0
    RETURNING j.ordering_key, j.queue, j.run_at INTO r;
    IF NOT FOUND THEN
        -- the callback was cancelled
        RETURN false;
    END IF;
    IF r.ordering_key IS NOT NULL AND NOT pgwake.release_ordering_key(r.ordering_key) THEN
        INSERT INTO pgwake.ordering_recheck (ordering_key) VALUES (r.ordering_key);
    END IF;
    IF r.run_at <= now() THEN
        PERFORM pg_notify('pgwake', r.queue);
    END IF;
    RETURN true;
END
$$;

-- Open a batch: enqueue its callback (held) and return its id, the
-- batch's id. `close_within`: the batch is closed by the rescuer's sweep
-- if no producer has closed it by then (1 second to 30 days; default 1
-- day), so a producer that died mid-batch cannot hold the callback
-- forever.
CREATE OR REPLACE FUNCTION pgwake.batch_open(
    task         text,
    payload      jsonb       DEFAULT '{}'::jsonb,
    queue        text        DEFAULT 'default',
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 25,
    timeout      interval    DEFAULT NULL,
    ordering_key text        DEFAULT NULL,
    limit_key    text        DEFAULT NULL,
    close_within interval    DEFAULT interval '1 day'
) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    new_id bigint;
BEGIN
    IF close_within IS NULL OR close_within < interval '1 second' OR close_within > interval '30 days' THEN
        RAISE EXCEPTION 'pgwake: close_within %: expected 1 second to 30 days', coalesce(close_within::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'A batch still open after close_within is closed by the rescuer, and its callback runs with the jobs added by then.';
    END IF;
    new_id := pgwake.enqueue(batch_open.task, batch_open.payload, batch_open.queue, now(),
                         batch_open.priority, batch_open.max_attempts, batch_open.timeout,
                         ordering_key => batch_open.ordering_key, limit_key => batch_open.limit_key);
    UPDATE pgwake.jobs j SET parents_open = 1, held = true WHERE j.id = new_id;
    INSERT INTO pgwake.batches (id, close_by) VALUES (new_id, now() + close_within);
    RETURN new_id;
END
$$;

-- Add job `job_id`, just enqueued by this transaction, to batch `b`
-- (pgwake.enqueue's `batch`). Refuses an unknown batch, an id that is not
-- a batch, a closed batch, a batch whose callback is gone, and the job
-- past pgwake.max_batch_jobs().
CREATE OR REPLACE FUNCTION pgwake.batch_add(job_id bigint, b bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r pgwake.batches;
    counts jsonb := coalesce(nullif(current_setting('pgwake.batch_counts', true), ''), '{}')::jsonb;
    pending jsonb := counts -> b::text;
BEGIN
    -- Read here (called once per job added); pgwake.batch_row says why not.
    SELECT * INTO r FROM pgwake.batches x WHERE x.id = b;
    IF r.id IS NULL THEN
        r := pgwake.batch_row(b, false);
    END IF;
    IF r.closed_at IS NOT NULL THEN
        RAISE EXCEPTION 'pgwake: batch % is closed (at %): no job can be added to it', b, r.closed_at
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Open a new batch (pgwake.batch_open) for these jobs.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = b AND j.parents_open > 0) THEN
        RAISE EXCEPTION 'pgwake: batch %''s callback was cancelled: no job can be added to it', b
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Open a new batch (pgwake.batch_open) for these jobs.';
    END IF;
    IF r.added + coalesce((pending ->> 0)::bigint, 0) >= pgwake.max_batch_jobs() THEN
        RAISE EXCEPTION 'pgwake: batch % has % jobs: at most % are allowed',
            b, r.added + coalesce((pending ->> 0)::bigint, 0), pgwake.max_batch_jobs()
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Split the work into several batches, and wait for them with a job enqueued after their callbacks.';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = job_id AND j.created_at = now())
       OR EXISTS (SELECT 1 FROM pgwake.job_parents e WHERE e.parent = job_id AND e.batch) THEN
        RAISE EXCEPTION 'pgwake: job % was not enqueued by this transaction: a job is added to a batch when it is enqueued', job_id
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO pgwake.job_parents (parent, child, on_failure, state, batch)
    VALUES (job_id, b, 'run', 'open', true);
    UPDATE pgwake.jobs j SET has_children = true WHERE j.id = job_id AND NOT j.has_children;
    IF pending IS NULL THEN
        PERFORM pgwake.batch_count(b, 1, 0);
    ELSE
        -- pgwake.batch_count's work, inline: the check is queued already.
        PERFORM set_config('pgwake.batch_counts', jsonb_set(counts, ARRAY[b::text],
            jsonb_build_array((pending ->> 0)::bigint + 1, (pending ->> 1)::bigint))::text, true);
    END IF;
END
$$;

-- End the edge of `parent_id` to its batch, if it has one and it is open,
-- and count it for this transaction.
CREATE OR REPLACE FUNCTION pgwake.end_batch_edge(parent_id bigint) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    b bigint;
BEGIN
    UPDATE pgwake.job_parents e SET state = 'done'
    WHERE e.parent = parent_id AND e.batch AND e.state = 'open'
    RETURNING e.child INTO b;
    IF b IS NOT NULL THEN
        PERFORM pgwake.batch_count(b, 0, 1);
    END IF;
END
$$;

-- Close batch `b` (`closer`: 'producer' or 'timeout'): no job can be added;
-- the callback is released now if every job has ended, else in the commit
-- that ends the last. Returns false if it was closed already.
CREATE OR REPLACE FUNCTION pgwake.close_batch(b bigint, closer text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r pgwake.batches := pgwake.batch_row(b, true);
BEGIN
    IF r.closed_at IS NOT NULL THEN
        RETURN false;
    END IF;
    -- This transaction's own adds first.
    PERFORM pgwake.batch_apply(b);
    UPDATE pgwake.batches x SET closed_at = now(), closed_by = closer WHERE x.id = b
    RETURNING * INTO r;
    IF r.ended >= r.added THEN
        PERFORM pgwake.release_batch(b);
    END IF;
    RETURN true;
END
$$;

-- Close batch `b`: its producer has added every job. Closing a closed
-- batch changes nothing (a NOTICE says so) and returns false.
CREATE OR REPLACE FUNCTION pgwake.batch_close(b bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    IF NOT pgwake.close_batch(b, 'producer') THEN
        RAISE NOTICE 'pgwake.batch_close: batch % is closed already', b;
        RETURN false;
    END IF;
    RETURN true;
END
$$;

-- Batch `b`'s progress as JSON: `state` ('open', 'closed': waiting for its
-- last jobs, 'released': its callback was released), the counts of
-- pgwake.batch_summary (as they were at the release, once released),
-- `callback`: where its callback is ('held', 'waiting', 'running',
-- 'dead', 'cancelled', 'ended'), and the times.
CREATE OR REPLACE FUNCTION pgwake.batch_status(b bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off AS $$
DECLARE
    r pgwake.batches := pgwake.batch_row(b, false);
    cb text;
    err text;
BEGIN
    IF EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = b) THEN
        cb := 'running';
    ELSIF EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = b AND j.parents_open > 0) THEN
        cb := 'held';
    ELSIF EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = b) THEN
        cb := 'waiting';
    ELSE
        SELECT d.last_error INTO err FROM pgwake.dead_jobs d WHERE d.id = b;
        cb := CASE WHEN NOT FOUND THEN 'ended' WHEN err = 'cancelled' THEN 'cancelled' ELSE 'dead' END;
    END IF;
    RETURN coalesce(r.summary, pgwake.batch_summary(b)) || jsonb_build_object(
        'batch', b,
        'state', CASE WHEN r.released_at IS NOT NULL THEN 'released'
                      WHEN r.closed_at IS NOT NULL THEN 'closed' ELSE 'open' END,
        'callback', cb,
        'opened_at', r.opened_at, 'close_by', r.close_by, 'closed_at', r.closed_at,
        'closed_by', r.closed_by, 'released_at', r.released_at);
END
$$;
