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
    IF EXISTS (SELECT 1 FROM pgwake.jobs j
               WHERE j.ordering_key = $1
                 AND (j.priority, coalesce(j.ordering_at, j.run_at), j.id) < ($2, $3, $4))
       OR EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.ordering_key = $1) THEN
        RETURN false;
    END IF;
    IF NOT pg_try_advisory_xact_lock(hashtextextended($1, 5262466120913749583)) THEN
        RETURN false;
    END IF;
    RETURN NOT EXISTS (SELECT 1 FROM pgwake.jobs j
                       WHERE j.ordering_key = $1
                         AND (j.priority, coalesce(j.ordering_at, j.run_at), j.id) < ($2, $3, $4))
       AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.ordering_key = $1);
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
                     unique_key)
                VALUES (enqueue_unique.task, coalesce(enqueue_unique.payload, '{}'::jsonb),
                        coalesce(enqueue_unique.queue, 'default'),
                        coalesce(enqueue_unique.run_at, now()),
                        coalesce(enqueue_unique.priority, 0),
                        coalesce(enqueue_unique.max_attempts, 25), enqueue_unique.timeout,
                        enqueue_unique.ordering_key, enqueue_unique.unique_key)
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
                 unique_key)
            VALUES (enqueue_unique.task, coalesce(enqueue_unique.payload, '{}'::jsonb),
                    coalesce(enqueue_unique.queue, 'default'), coalesce(enqueue_unique.run_at, now()),
                    coalesce(enqueue_unique.priority, 0), coalesce(enqueue_unique.max_attempts, 25),
                    enqueue_unique.timeout, enqueue_unique.ordering_key, enqueue_unique.unique_key)
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
