-- pgwake schema, version 17: a key's blocked jobs are out of the claims'
-- way (issue 21, item 9; ARCHITECTURE.md → "A key's blocked jobs are held").
--
-- Every claim walks its claim index in claim order and asks
-- pgwake.ordering_free() of each keyed job it meets. A key with 20,000
-- ready jobs behind a running one made every claim probe all 20,000 (0.5 s
-- a claim). Now a keyed job that waits behind an earlier job of its key is
-- `held`, and the claim indexes hold only jobs that are not: a claim meets
-- at most a key's first waiting job. `held` is a hint, never the guard:
-- ordering_free() still decides, so a job released too early costs a probe,
-- never a second run of its key; a job held too long waits, and the
-- rescuer's sweep (pgwake.release_stalled_keys) releases it.
--
-- Who sets it (functions/keys.sql has the current definitions of the
-- functions below; this file creates the triggers, which only a migration
-- changes):
-- * the insert trigger jobs_hold_ordering_key (BEFORE INSERT, keyed rows):
--   held when a job of the key comes before it in pgwake.jobs or one is
--   leased; plain INSERTs get it like every producer;
-- * the deferred triggers jobs_release_ordering_key and
--   leased_jobs_release_ordering_key: when a keyed job leaves pgwake.jobs
--   (claimed, cancelled) or pgwake.leased_jobs (done, failed, dead,
--   cancelled, rescued), at the commit of that transaction — a tx-mode job
--   ends when its claim transaction commits; a rollback releases nothing
--   and needs to: the job is back, first of its key — the key's first job
--   is released unless a job of the key is leased.
--
-- Cost of this migration: `held` is added without a rewrite; the keyed jobs
-- that wait behind another of their key are marked (one pass over the keyed
-- jobs: jobs a claim holds now are skipped, they only cost a probe later);
-- jobs_claim_idx is rebuilt as a partial index, and jobs_queue_ready_idx
-- built. All in one transaction that holds the ACCESS EXCLUSIVE lock of
-- the ADD COLUMN: inserts and claims wait for the whole migration
-- (measured: 5.6 s for 1,100,000 waiting jobs, 100,000 of them keyed, on 2
-- busy cores; a few ms on an empty queue).

ALTER TABLE pgwake.jobs ADD COLUMN held boolean NOT NULL DEFAULT false;
-- Only a keyed job can be held (a producer cannot hide an unkeyed job from
-- the claims). NOT VALID: every existing row is false; no scan.
ALTER TABLE pgwake.jobs ADD CONSTRAINT jobs_held_keyed
    CHECK (NOT held OR ordering_key IS NOT NULL) NOT VALID;

-- Keys whose release could not be made at once (a producer was inserting a
-- job of the key at that moment; an insert in a REPEATABLE READ or
-- SERIALIZABLE transaction): the rescuer releases them on its next run.
-- No key constraint: an insert here never waits.
CREATE TABLE pgwake.ordering_recheck (
    ordering_key text        NOT NULL,
    noted_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ordering_recheck_key_idx ON pgwake.ordering_recheck (ordering_key);

-- The jobs already waiting: hold every keyed job that has an earlier job of
-- its key, or a leased one.
UPDATE pgwake.jobs SET held = true
WHERE ctid = ANY(ARRAY(
    SELECT j.ctid FROM pgwake.jobs j
    WHERE j.ordering_key IS NOT NULL
      AND (EXISTS (SELECT 1 FROM pgwake.jobs e
                   WHERE e.ordering_key = j.ordering_key
                     AND (e.priority, coalesce(e.ordering_at, e.run_at), e.id)
                         < (j.priority, coalesce(j.ordering_at, j.run_at), j.id))
           OR EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.ordering_key = j.ordering_key))
    FOR UPDATE SKIP LOCKED));

-- The claim indexes without the held jobs. jobs_claim_idx (the claims over
-- every queue) is only the claims': rebuilt partial under its name.
-- jobs_queue_claim_idx stays whole (the sampler's and `pgwake stats`'
-- counts of waiting jobs per queue include held ones); the claims of one
-- queue and the ready-queues read walk jobs_queue_ready_idx.
CREATE INDEX jobs_claim_idx_ready ON pgwake.jobs (priority, run_at, id) WHERE NOT held;
DROP INDEX pgwake.jobs_claim_idx;
ALTER INDEX pgwake.jobs_claim_idx_ready RENAME TO jobs_claim_idx;
CREATE INDEX jobs_queue_ready_idx ON pgwake.jobs (queue, priority, run_at, id) WHERE NOT held;
-- A key's jobs that are not held (the insert of a job that comes first in
-- its key holds them), and the keys that have held jobs (the rescuer's
-- sweep). Keyed jobs only.
CREATE INDEX jobs_key_free_idx ON pgwake.jobs (ordering_key)
    WHERE ordering_key IS NOT NULL AND NOT held;
CREATE INDEX jobs_key_held_idx ON pgwake.jobs (ordering_key) WHERE held;

-- The lock that orders a key's inserts and releases (functions/keys.sql).
CREATE OR REPLACE FUNCTION pgwake.ordering_hold_lock(key text) RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (x'70677768'::bigint << 32) | (hashtext(key)::bigint & 255)
$$;

-- The functions the triggers call, as functions/keys.sql first defined
-- them (migrate then applies that file, which holds the current ones):
-- the triggers work from the commit of this migration on.
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
    SELECT j.id, j.held INTO head FROM pgwake.jobs j
    WHERE j.ordering_key = key
    ORDER BY j.priority, coalesce(j.ordering_at, j.run_at), j.id
    LIMIT 1;
    IF FOUND AND head.held THEN
        UPDATE pgwake.jobs SET held = false
        WHERE ctid = ANY(ARRAY(SELECT j.ctid FROM pgwake.jobs j
                               WHERE j.id = head.id AND j.held
                               FOR UPDATE SKIP LOCKED));
        IF NOT FOUND THEN
            sure := false;
        END IF;
    END IF;
    RETURN sure;
END
$$;

CREATE OR REPLACE FUNCTION pgwake.hold_ordering_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
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

CREATE TRIGGER jobs_hold_ordering_key
    BEFORE INSERT ON pgwake.jobs
    FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL)
    EXECUTE FUNCTION pgwake.hold_ordering_key();
-- Deferred: at the commit of the transaction that removed the job, when
-- everything it did (a retry's re-insert, a rescue) is in place, and never
-- for a transaction that rolls back.
CREATE CONSTRAINT TRIGGER jobs_release_ordering_key
    AFTER DELETE ON pgwake.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL)
    EXECUTE FUNCTION pgwake.release_ordering_key_trigger();
CREATE CONSTRAINT TRIGGER leased_jobs_release_ordering_key
    AFTER DELETE ON pgwake.leased_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.ordering_key IS NOT NULL)
    EXECUTE FUNCTION pgwake.release_ordering_key_trigger();
