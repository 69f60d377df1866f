-- The rescue of expired leases, row by row (src/db/sql/rescue.sql calls
-- it; the rescuer service runs it on every worker). Each expired lease
-- (SKIP LOCKED: two rescuers at once move each job once) goes back to
-- pgwake.jobs in its place (its run_at kept: a crash does not send it, or
-- its ordering key, behind every other job; the insert trigger wakes every
-- listening worker), or, when that was its last attempt or its cancel was
-- requested (its worker died before it could stop it), to
-- pgwake.dead_jobs. A lease its claim put in the worker's prefetch buffer
-- (`buffered`, migration 0024) may never have started: it goes back with
-- its attempt refunded, never dead, marked a suspect (`refunded`); a
-- suspect is claimed only onto a free slot, so a job that kills its
-- workers is charged from its next run on. Each row moves
-- in a subtransaction of its own: one row that cannot be moved (say a
-- producer inserted a job with an explicit id equal to the leased job's)
-- is reported as failed with the server's message and stays leased, and
-- the others move all the same. Returns one row per lease: its queue, what
-- became of it (requeued, dead, failed), its id and the error.
CREATE OR REPLACE FUNCTION pgwake.rescue(batch bigint)
RETURNS TABLE (queue text, what text, job_id bigint, error text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l pgwake.leased_jobs;
    cancelled boolean;
BEGIN
    FOR l IN SELECT * FROM pgwake.leased_jobs x
             WHERE x.lease_until < now()
             ORDER BY x.lease_until
             LIMIT batch
             FOR UPDATE SKIP LOCKED
    LOOP
        queue := l.queue;
        job_id := l.id;
        error := NULL;
        BEGIN
            DELETE FROM pgwake.leased_jobs x WHERE x.token = l.token;
            cancelled := EXISTS (SELECT 1 FROM pgwake.cancel_requests r WHERE r.job_id = l.id);
            IF l.buffered AND NOT cancelled THEN
                INSERT INTO pgwake.jobs
                    (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                     last_error, created_at, timeout, ordering_key, unique_key, ordering_at,
                     limit_key, suspect)
                VALUES (l.id, l.queue, l.task, l.payload, l.priority, l.run_at,
                        greatest(l.attempts - 1, 0), l.max_attempts,
                        format('worker %s stopped heartbeating while this job was in its prefetch buffer (attempt %s refunded)',
                               l.worker_id, l.attempts),
                        l.created_at, l.timeout, l.ordering_key,
                        pgwake.requeued_unique_key(l.unique_key),
                        coalesce(l.ordering_at, l.run_at), l.limit_key, true);
                what := 'refunded';
            ELSIF l.attempts < l.max_attempts AND NOT cancelled THEN
                INSERT INTO pgwake.jobs
                    (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                     last_error, created_at, timeout, ordering_key, unique_key, ordering_at,
                     limit_key, suspect)
                VALUES (l.id, l.queue, l.task, l.payload, l.priority, l.run_at, l.attempts,
                        l.max_attempts,
                        format('lease expired on attempt %s (worker %s stopped heartbeating)',
                               l.attempts, l.worker_id),
                        l.created_at, l.timeout, l.ordering_key,
                        -- a job enqueued with this unique key meanwhile keeps
                        -- it; never waits (keys.sql)
                        pgwake.requeued_unique_key(l.unique_key),
                        -- a suspect stays one until a run of it ends
                        coalesce(l.ordering_at, l.run_at), l.limit_key, l.suspect);
                what := 'requeued';
            ELSE
                INSERT INTO pgwake.dead_jobs AS d
                    (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                     last_error, created_at, timeout, worker_id, started_at, ordering_key,
                     unique_key, ordering_at, limit_key)
                VALUES (l.id, l.queue, l.task, l.payload, l.priority, l.run_at,
                        least(l.attempts, l.max_attempts), l.max_attempts,
                        CASE WHEN cancelled THEN 'cancelled'
                             ELSE format('lease expired on the last attempt (%s of %s; worker %s stopped heartbeating)',
                                         l.attempts, l.max_attempts, l.worker_id)
                        END,
                        l.created_at, l.timeout, l.worker_id, l.leased_at, l.ordering_key,
                        l.unique_key, l.ordering_at, l.limit_key)
                ON CONFLICT (id) DO UPDATE SET
                    queue = excluded.queue, task = excluded.task, payload = excluded.payload,
                    priority = excluded.priority, run_at = excluded.run_at,
                    attempts = excluded.attempts, max_attempts = excluded.max_attempts,
                    last_error = excluded.last_error, created_at = excluded.created_at,
                    timeout = excluded.timeout, worker_id = excluded.worker_id,
                    started_at = excluded.started_at, ordering_key = excluded.ordering_key,
                    unique_key = excluded.unique_key, ordering_at = excluded.ordering_at,
                    limit_key = excluded.limit_key, failed_at = now();
                what := 'dead';
            END IF;
        EXCEPTION WHEN OTHERS THEN
            what := 'failed';
            error := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The rescuer's sweep of key slots (migration 0022): the rows of
-- pgwake.key_slots of up to `batch` keys, from after (`after_queue`,
-- `after_key`) (NULL: the first) in key order, are deleted when the key has
-- no job left: none waiting, scheduled or held in pgwake.jobs (a tx-mode
-- job that runs is still there for every other transaction until its claim
-- commits), none leased (a lease that holds a slot has its token in the
-- slot's row). So 100,000 one-off keys do not leave 100,000 × limit rows
-- for good. Rows a claim has locked are skipped (SKIP LOCKED), never waited
-- for. Returns the rows deleted and the key to go on from next time (NULL:
-- the sweep reached the last key and starts over).
--
-- A job of the key inserted while its rows are deleted can find them
-- present and leave them to this deletion (the insert trigger adds a key's
-- rows only when it has none): its key then has a ready job and no rows,
-- which pgwake.fair_key_jobs reports and the worker repairs
-- (pgwake.repair_key_slots) at the first claim that visits the key.
CREATE OR REPLACE FUNCTION pgwake.sweep_key_slots(after_queue text, after_key text, batch bigint)
RETURNS TABLE (swept bigint, next_queue text, next_key text)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    qs text[];
    ks text[];
BEGIN
    -- The next keys that have rows, walking the primary key.
    SELECT coalesce(array_agg(x.queue), '{}'), coalesce(array_agg(x.limit_key), '{}') INTO qs, ks
    FROM (SELECT DISTINCT s.queue, s.limit_key FROM pgwake.key_slots s
          WHERE after_queue IS NULL OR (s.queue, s.limit_key) > (after_queue, after_key)
          ORDER BY s.queue, s.limit_key
          LIMIT batch) x;
    WITH gone AS (
        SELECT k.queue, k.limit_key FROM unnest(qs, ks) AS k(queue, limit_key)
        WHERE NOT EXISTS (SELECT FROM pgwake.jobs j
                          WHERE j.queue = k.queue AND j.limit_key COLLATE "C" = k.limit_key
                            AND NOT j.held)
          AND NOT EXISTS (SELECT FROM pgwake.jobs j
                          WHERE j.queue = k.queue AND j.limit_key COLLATE "C" = k.limit_key
                            AND j.held)
          AND NOT EXISTS (SELECT FROM pgwake.leased_jobs l
                          WHERE l.queue = k.queue AND l.limit_key = k.limit_key
                            AND NOT l.holds_key_slot)
          AND NOT EXISTS (SELECT FROM pgwake.key_slots y
                          WHERE y.queue = k.queue AND y.limit_key = k.limit_key
                            AND y.lease_token IS NOT NULL)
    ),
    deleted AS (
        DELETE FROM pgwake.key_slots s
        WHERE (s.queue, s.limit_key, s.slot) IN (
            SELECT y.queue, y.limit_key, y.slot
            FROM pgwake.key_slots y JOIN gone g ON g.queue = y.queue AND g.limit_key = y.limit_key
            WHERE y.lease_token IS NULL
            FOR UPDATE OF y SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) INTO swept FROM deleted;
    IF cardinality(qs) < batch THEN
        next_queue := NULL;
        next_key := NULL;
    ELSE
        next_queue := qs[cardinality(qs)];
        next_key := ks[cardinality(ks)];
    END IF;
    RETURN NEXT;
END
$$;
