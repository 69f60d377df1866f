-- Ordered keys and unique jobs (migration 0008; ARCHITECTURE → Ordered
-- keys and unique jobs).

-- May the waiting job `job` (priority, ordering position `at`) of ordering
-- key `key` start now? Called by every claim statement for keyed jobs only
-- (`ordering_key IS NULL OR pgwake.ordering_free(…)`), before the row is
-- locked. True when the job is its key's head and no job of the key runs:
--   1. no job of the key comes before it in pgwake.jobs, and none is leased
--      (a cheap first look, so that only heads take the lock below);
--   2. this transaction takes the key's advisory lock (transaction-level:
--      released at commit or rollback, so a crash cannot keep it). A tx-mode
--      claim holds it while its jobs run; a lease claim until its commit;
--   3. the same look again. VOLATILE: in READ COMMITTED each statement of
--      this function takes a new snapshot, taken after the lock, so it sees
--      every claim of the key that committed before we got the lock, and no
--      other claim of the key is in progress (it would hold the lock).
CREATE OR REPLACE FUNCTION pgwake.ordering_free(key text, priority integer, at timestamptz, job bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF pgwake.ordering_earlier(key, priority, at, job)
       OR EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.ordering_key = $1) THEN
        RETURN false;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended($1, 5262466120913749583)) THEN
        RETURN false;
    END IF;
    RETURN NOT pgwake.ordering_earlier(key, priority, at, job)
       AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.ordering_key = $1);
END
$$;

-- Whether a job of `key` in pgwake.jobs comes before the place (priority,
-- at, job): the key's first job, read as the first entry of
-- jobs_ordering_idx, compared with it — one index descent. (Asked as
-- `EXISTS (… WHERE (priority, coalesce(ordering_at, run_at), id) < …)`,
-- the index scan of a key's first job read every entry of its key: 500
-- pages, 6–15 ms, at 100,000 jobs.) VOLATILE: a new snapshot per call
-- (ordering_free calls it again after taking the key's lock).
CREATE OR REPLACE FUNCTION pgwake.ordering_earlier(key text, priority integer, at timestamptz, job bigint)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN coalesce((SELECT (f.priority, f.at, f.id) < (ordering_earlier.priority, ordering_earlier.at, ordering_earlier.job)
                     FROM (SELECT j.priority, coalesce(j.ordering_at, j.run_at) AS at, j.id
                           FROM pgwake.jobs j
                           WHERE j.ordering_key = ordering_earlier.key
                           ORDER BY j.priority, coalesce(j.ordering_at, j.run_at), j.id
                           LIMIT 1) f), false);
END
$$;
-- Enqueue one job; a job with a `unique_key` that already waits is not
-- inserted again: its id comes back with duplicate = true.
--   SELECT * FROM pgwake.enqueue_unique('sync', unique_key => 'user:42');
-- A tx-mode job of the key that is running right now (its row deleted by a
-- transaction still open) makes the INSERT wait for that transaction: at
-- most the job's timeout (docs/src/keys.md → Unique jobs).
-- `unique_running => true`: a job of the key that is running counts too
-- (at most one waiting-or-running): its id comes back as the duplicate,
-- without waiting for it.
CREATE OR REPLACE FUNCTION pgwake.enqueue_unique(
    task         text,
    payload      jsonb       DEFAULT '{}'::jsonb,
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 25,
    timeout      interval    DEFAULT NULL,
    ordering_key text        DEFAULT NULL,
    unique_key   text        DEFAULT NULL,
    unique_running boolean   DEFAULT false,
    limit_key    text        DEFAULT NULL,
    OUT id        bigint,
    OUT duplicate boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    running bigint;
    inserted boolean;
BEGIN
    LOOP
        IF enqueue_unique.unique_running AND enqueue_unique.unique_key IS NOT NULL THEN
            -- Waiting, or running: leased, or claimed in tx mode (its row
            -- is still visible, deleted by the open claim transaction).
            -- One statement, one snapshot: a lease claim moves the row in
            -- one commit, so it is seen in exactly one of the two tables.
            SELECT x.id INTO enqueue_unique.id FROM (
                SELECT j.id FROM pgwake.jobs j WHERE j.unique_key = enqueue_unique.unique_key
                UNION ALL
                SELECT l.id FROM pgwake.leased_jobs l WHERE l.unique_key = enqueue_unique.unique_key
            ) x LIMIT 1;
            IF FOUND THEN
                duplicate := true;
                RETURN;
            END IF;
        END IF;
        IF enqueue_unique.unique_running AND enqueue_unique.unique_key IS NOT NULL THEN
            -- A job of the key that was waiting at the look above may have
            -- been leased before this INSERT (which then met no conflict): a
            -- new snapshot sees that lease. Then this insert is undone (its
            -- subtransaction rolled back: no DELETE right needed) and the
            -- running job is the duplicate.
            BEGIN
                INSERT INTO pgwake.jobs AS j
                    (task, payload, queue, run_at, priority, max_attempts, timeout, ordering_key,
                     unique_key, limit_key)
                VALUES (enqueue_unique.task, coalesce(enqueue_unique.payload, '{}'::jsonb),
                        coalesce(enqueue_unique.queue, 'default'),
                        coalesce(enqueue_unique.run_at, now()),
                        coalesce(enqueue_unique.priority, 0),
                        coalesce(enqueue_unique.max_attempts, 25), enqueue_unique.timeout,
                        enqueue_unique.ordering_key, enqueue_unique.unique_key,
                        enqueue_unique.limit_key)
                ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
                RETURNING j.id INTO enqueue_unique.id;
                inserted := FOUND;
                IF inserted THEN
                    SELECT l.id INTO running FROM pgwake.leased_jobs l
                    WHERE l.unique_key = enqueue_unique.unique_key LIMIT 1;
                    IF FOUND THEN
                        RAISE EXCEPTION USING ERRCODE = 'PWK01';
                    END IF;
                END IF;
            EXCEPTION WHEN SQLSTATE 'PWK01' THEN
                id := running;
                duplicate := true;
                RETURN;
            END;
        ELSE
            INSERT INTO pgwake.jobs AS j
                (task, payload, queue, run_at, priority, max_attempts, timeout, ordering_key,
                 unique_key, limit_key)
            VALUES (enqueue_unique.task, coalesce(enqueue_unique.payload, '{}'::jsonb),
                    coalesce(enqueue_unique.queue, 'default'), coalesce(enqueue_unique.run_at, now()),
                    coalesce(enqueue_unique.priority, 0), coalesce(enqueue_unique.max_attempts, 25),
                    enqueue_unique.timeout, enqueue_unique.ordering_key, enqueue_unique.unique_key,
                    enqueue_unique.limit_key)
            ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
            RETURNING j.id INTO enqueue_unique.id;
            inserted := FOUND;
        END IF;
        IF inserted THEN
            duplicate := false;
            RETURN;
        END IF;
        -- A new statement, a new snapshot: sees the conflicting job even if
        -- it committed after this call began.
        SELECT j.id INTO enqueue_unique.id FROM pgwake.jobs j
        WHERE j.unique_key = enqueue_unique.unique_key;
        IF FOUND THEN
            duplicate := true;
            RETURN;
        END IF;
        -- It was claimed (or cancelled) in between: insert again.
    END LOOP;
END
$$;

-- Unique keys put back without waiting (lease retries and hand-backs,
-- rescues, dead-job retries). A job that was running held no unique-index
-- entry, so a producer may have inserted a job with its key in a
-- transaction still open. A put-back that inserted the key would wait on
-- that producer's uncommitted index entry for as long as its transaction
-- lasts, and with it the worker's outcome writes. So every insert of a
-- keyed job takes a shared lock on its key for its transaction (the
-- trigger below), and a put-back keeps the key only if it gets the key's
-- lock at once and no job waits with it; otherwise the job goes back
-- without the key, which the producer's job keeps. Lock ids are a hash of
-- the key in a class of pgwake's own: a collision only costs a key.
CREATE OR REPLACE FUNCTION pgwake.unique_key_lock(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (x'70677775'::bigint << 32) | (hashtext(key)::bigint & x'ffffffff'::bigint)
$$;

CREATE OR REPLACE FUNCTION pgwake.hold_unique_key() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgwake.unique_key_lock(NEW.unique_key));
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER jobs_hold_unique_key
    BEFORE INSERT ON pgwake.jobs
    FOR EACH ROW WHEN (NEW.unique_key IS NOT NULL)
    EXECUTE FUNCTION pgwake.hold_unique_key();

-- The unique key a job put back keeps: `key`, or NULL when another job
-- waits with it or a producer is inserting one right now. Never waits.
CREATE OR REPLACE FUNCTION pgwake.requeued_unique_key(key text) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF key IS NULL
       OR NOT pg_try_advisory_xact_lock(pgwake.unique_key_lock(key))
       OR EXISTS (SELECT 1 FROM pgwake.jobs w WHERE w.unique_key = key) THEN
        RETURN NULL;
    END IF;
    RETURN key;
END
$$;

-- A key's blocked jobs are held (migration 0017; ARCHITECTURE.md → "A
-- key's blocked jobs are held"). A keyed job that waits behind an earlier
-- job of its key is `held`: out of the claim indexes, so a claim meets at
-- most the first waiting job of a key, however many wait behind it.
-- `held` is a hint: ordering_free() still decides whether a job may start,
-- so a job released too early costs a claim one probe, never a second run
-- of its key; a job held when it should not be waits until the rescuer's
-- sweep releases it (release_stalled_keys below).
--
-- Inserts and releases of one key are ordered by the key's lock
-- (ordering_hold_lock): an insert takes it shared until its transaction
-- ends; a release tries it exclusively, without waiting (a worker never
-- waits for a producer's transaction). A release that cannot get it (a job
-- of the key may be being inserted by a transaction still open, which
-- decided from what it saw before this job ended) releases what it sees and
-- notes the key in pgwake.ordering_recheck: the rescuer releases it again
-- later. The lock is one of 256 stripes, not one per key: a transaction
-- that inserts jobs of 100,000 keys holds at most 256 locks (one per key
-- would overflow the server's lock table, max_locks_per_transaction). A
-- stripe shared with another key's producer only costs a note (the release
-- of what is visible is made all the same).
CREATE OR REPLACE FUNCTION pgwake.ordering_hold_lock(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (x'70677768'::bigint << 32) | (hashtext(key)::bigint & 255)
$$;

-- BEFORE INSERT of a keyed job (trigger jobs_hold_ordering_key, migration
-- 0017): held when a job of its key comes before it in pgwake.jobs (waiting,
-- or running in tx mode: a row its claim deleted but has not committed) or
-- one is leased. A job that comes first (none of its key, or it was
-- enqueued ahead of the waiting ones: a higher priority, an earlier
-- run_at) is not held, and holds the key's jobs released before it, but
-- those a claim holds now (they run). SECURITY DEFINER: a producer needs no
-- right on leased_jobs or to update jobs.
CREATE OR REPLACE FUNCTION pgwake.hold_ordering_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    -- held for its parents (functions/flows.sql): the key does not undo it
    for_parents boolean := NEW.parents_open > 0;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(pgwake.ordering_hold_lock(NEW.ordering_key));
    -- ordering_earlier(), inlined (one plpgsql call per row, not two).
    NEW.held := coalesce((SELECT (f.priority, f.at, f.id)
                                 < (NEW.priority, coalesce(NEW.ordering_at, NEW.run_at), NEW.id)
                          FROM (SELECT j.priority, coalesce(j.ordering_at, j.run_at) AS at, j.id
                                FROM pgwake.jobs j
                                WHERE j.ordering_key = NEW.ordering_key
                                ORDER BY j.priority, coalesce(j.ordering_at, j.run_at), j.id
                                LIMIT 1) f), false)
             OR EXISTS (SELECT 1 FROM pgwake.leased_jobs l
                        WHERE l.ordering_key = NEW.ordering_key AND l.id <> NEW.id);
    IF NOT NEW.held THEN
        NEW.held := for_parents;
        -- Usually none (the key was empty): a probe, not an UPDATE.
        IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j
                       WHERE j.ordering_key = NEW.ordering_key AND NOT j.held) THEN
            RETURN NEW;
        END IF;
        UPDATE pgwake.jobs SET held = true
        WHERE ctid = ANY(ARRAY(SELECT j.ctid FROM pgwake.jobs j
                               WHERE j.ordering_key = NEW.ordering_key AND NOT j.held
                               FOR UPDATE SKIP LOCKED));
    ELSIF current_setting('transaction_isolation') <> 'read committed' THEN
        -- This transaction's snapshot may be older than the end of the job
        -- it waits for, whose release could not see this one.
        INSERT INTO pgwake.ordering_recheck (ordering_key) VALUES (NEW.ordering_key);
    END IF;
    RETURN NEW;
END
$$;

-- Release the first job of `key` unless a job of the key is leased. Never
-- waits. False when it could not be sure: a producer of the key holds the
-- key's lock (its job may come first), or the first job is locked (a
-- producer is holding it, or a claim that does not look at `held`).
CREATE OR REPLACE FUNCTION pgwake.release_ordering_key(key text) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    sure boolean := true;
    head record;
BEGIN
    IF EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.ordering_key = key) THEN
        RETURN true;  -- the lease's end releases the key
    END IF;
    IF NOT pg_try_advisory_xact_lock(pgwake.ordering_hold_lock(key)) THEN
        sure := false;
    END IF;
    -- A new snapshot, after the lock: every insert of the key that got the
    -- lock before us has committed.
    SELECT j.id, j.held, j.parents_open INTO head FROM pgwake.jobs j
    WHERE j.ordering_key = key
    ORDER BY j.priority, coalesce(j.ordering_at, j.run_at), j.id
    LIMIT 1;
    -- A head that waits for its parents stays held (functions/flows.sql):
    -- the release of its last parent releases the key again.
    IF FOUND AND head.held AND head.parents_open = 0 THEN
        UPDATE pgwake.jobs SET held = false
        WHERE ctid = ANY(ARRAY(SELECT j.ctid FROM pgwake.jobs j
                               WHERE j.id = head.id AND j.held AND j.parents_open = 0
                               FOR UPDATE SKIP LOCKED));
        IF NOT FOUND THEN
            sure := false;
        END IF;
    END IF;
    RETURN sure;
END
$$;

-- AFTER DELETE on pgwake.jobs and pgwake.leased_jobs, deferred to the
-- commit (triggers *_release_ordering_key, migration 0017).
CREATE OR REPLACE FUNCTION pgwake.release_ordering_key_trigger() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    -- The usual case, a key with no held job (its only job ended, or the
    -- next one was not held): one probe, if no producer of the key is
    -- inserting now. The lock is held to the commit; the probe is a
    -- statement of its own, so its snapshot is taken after the lock.
    IF pg_try_advisory_xact_lock(pgwake.ordering_hold_lock(OLD.ordering_key)) THEN
        IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j
                       WHERE j.ordering_key = OLD.ordering_key AND j.held) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF NOT pgwake.release_ordering_key(OLD.ordering_key) THEN
        INSERT INTO pgwake.ordering_recheck (ordering_key) VALUES (OLD.ordering_key);
    END IF;
    RETURN NULL;
END
$$;

-- The rescuer's sweep (src/db/sql/release_keys.sql), so that no key stays
-- held for good, whatever went wrong: first the keys noted in
-- pgwake.ordering_recheck (a note stays until its key's release is sure),
-- then up to `batch` keys that have held jobs, in key order from after
-- `after` (the caller passes back `next_after`: NULL when the sweep reached
-- the last key, so the next one starts over). Returns how many jobs each
-- part released; a job released by the second part had been held with
-- nothing before it running: a release was missed.
CREATE OR REPLACE FUNCTION pgwake.release_stalled_keys(
    after text, batch bigint,
    OUT rechecked bigint, OUT stalled bigint, OUT next_after text)
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    k text;
    before boolean;
    seen bigint := 0;
BEGIN
    rechecked := 0;
    stalled := 0;
    FOR k IN SELECT DISTINCT r.ordering_key FROM pgwake.ordering_recheck r LIMIT batch LOOP
        before := pgwake.key_first_held(k);
        IF pgwake.release_ordering_key(k) THEN
            DELETE FROM pgwake.ordering_recheck r WHERE r.ordering_key = k;
        END IF;
        IF before AND NOT pgwake.key_first_held(k) THEN
            rechecked := rechecked + 1;
        END IF;
    END LOOP;
    next_after := NULL;
    FOR k IN
        WITH RECURSIVE keys AS (
            (SELECT j.ordering_key FROM pgwake.jobs j
             WHERE j.held AND (after IS NULL OR j.ordering_key > after)
             ORDER BY j.ordering_key LIMIT 1)
            UNION ALL
            SELECT (SELECT j.ordering_key FROM pgwake.jobs j
                    WHERE j.held AND j.ordering_key > keys.ordering_key
                    ORDER BY j.ordering_key LIMIT 1)
            FROM keys
            WHERE keys.ordering_key IS NOT NULL
        )
        SELECT keys.ordering_key FROM keys WHERE keys.ordering_key IS NOT NULL LIMIT batch
    LOOP
        next_after := k;
        seen := seen + 1;
        IF pgwake.key_first_held(k) THEN
            PERFORM pgwake.release_ordering_key(k);
            IF NOT pgwake.key_first_held(k) THEN
                stalled := stalled + 1;
            END IF;
        END IF;
    END LOOP;
    IF seen < batch THEN
        next_after := NULL;  -- the last key: start over next time
    END IF;
END
$$;

-- Whether the first job of `key` in pgwake.jobs is held by its key (not
-- for its parents: their release is the flows' sweep's).
CREATE OR REPLACE FUNCTION pgwake.key_first_held(key text) RETURNS boolean
LANGUAGE sql VOLATILE AS $$
    SELECT coalesce((SELECT j.held AND j.parents_open = 0 FROM pgwake.jobs j WHERE j.ordering_key = key
                     ORDER BY j.priority, coalesce(j.ordering_at, j.run_at), j.id
                     LIMIT 1), false)
$$;
