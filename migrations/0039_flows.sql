-- pgwake schema, version 39: dependencies between jobs (issue 36, items 1
-- and 2; ARCHITECTURE.md → "Flows: a child waits for its parents";
-- functions/flows.sql; docs/src/flows.md).
--
-- * `pgwake.jobs.parents_open`: how many of a waiting job's parents have not
--   ended done. A job with parents_open > 0 is `held` (out of the claim
--   indexes, migration 0017). `held` stays the one bit the claims read (no
--   claim statement or index changes); `parents_open` says the flows' part
--   of it, so the key code never releases a job whose parents are open and
--   the flow code leaves a keyed job's release to the key code.
-- * `has_children` on pgwake.jobs and pgwake.leased_jobs: set on a parent
--   when a child is added. The deferred AFTER DELETE triggers below run
--   only for a row that has it (the WHEN clause reads the deleted row): a
--   job without children pays nothing when it ends.
-- * `pgwake.job_parents`: one row per edge, with the child's policy for a
--   parent that ends dead or cancelled, and the edge's state.
--
-- Cost: three columns added without a rewrite (constant defaults), a brief
-- ACCESS EXCLUSIVE lock on jobs and leased_jobs; a new table. No index on
-- jobs: the rescuer's sweep walks the edges (job_parents_child_idx), so
-- nothing here scans the queue under a lock.
ALTER TABLE pgwake.jobs ADD COLUMN IF NOT EXISTS parents_open integer NOT NULL DEFAULT 0;
ALTER TABLE pgwake.jobs ADD COLUMN IF NOT EXISTS has_children boolean NOT NULL DEFAULT false;
ALTER TABLE pgwake.leased_jobs ADD COLUMN IF NOT EXISTS has_children boolean NOT NULL DEFAULT false;

-- A job is held for its key (keyed) or for its parents; nothing else.
ALTER TABLE pgwake.jobs DROP CONSTRAINT IF EXISTS jobs_held_keyed;
ALTER TABLE pgwake.jobs DROP CONSTRAINT IF EXISTS jobs_held_reason;
ALTER TABLE pgwake.jobs ADD CONSTRAINT jobs_held_reason
    CHECK (NOT held OR ordering_key IS NOT NULL OR parents_open > 0) NOT VALID;

CREATE TABLE IF NOT EXISTS pgwake.job_parents (
    parent     bigint      NOT NULL,
    child      bigint      NOT NULL,
    -- what the child does when this parent ends dead or cancelled:
    -- 'cancel' (it is cancelled, and its children by their own policies),
    -- 'run' (the edge counts as ended), 'wait' (held until the parent is
    -- retried and ends done)
    on_failure text        NOT NULL DEFAULT 'cancel'
        CONSTRAINT job_parents_on_failure_valid CHECK (on_failure IN ('cancel', 'run', 'wait')),
    -- 'open': the parent has not ended; 'done': it ended done (or failed
    -- under 'run'); 'failed': it ended dead or cancelled and the child
    -- waits for a retry ('wait') or was cancelled ('cancel')
    state      text        NOT NULL DEFAULT 'open'
        CONSTRAINT job_parents_state_valid CHECK (state IN ('open', 'done', 'failed')),
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (parent, child)
);
CREATE INDEX IF NOT EXISTS job_parents_child_idx ON pgwake.job_parents (child);

-- pgwake.enqueue gains `after` and `on_parent_failure` (functions/enqueue.sql).
DROP FUNCTION IF EXISTS pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval,
                                       text, text, boolean, text, text, text);

-- The triggers' function (functions/flows.sql) must exist before the
-- triggers: a stub, replaced by the file applied after the migrations.
CREATE OR REPLACE FUNCTION pgwake.release_children_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

-- Deferred to the commit of the transaction that removed the parent, as
-- the key releases are (migration 0017): by then a retry's re-insert, a
-- lease's move or a bury is in place, so where the job is says how it
-- ended; a transaction that rolls back fires nothing.
DROP TRIGGER IF EXISTS jobs_release_children ON pgwake.jobs;
CREATE CONSTRAINT TRIGGER jobs_release_children
    AFTER DELETE ON pgwake.jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.has_children)
    EXECUTE FUNCTION pgwake.release_children_trigger();
DROP TRIGGER IF EXISTS leased_jobs_release_children ON pgwake.leased_jobs;
CREATE CONSTRAINT TRIGGER leased_jobs_release_children
    AFTER DELETE ON pgwake.leased_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (OLD.has_children)
    EXECUTE FUNCTION pgwake.release_children_trigger();

