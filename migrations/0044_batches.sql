-- pgwake schema, version 44: batches with a callback (issue 36, item 4;
-- ARCHITECTURE.md → "Batches: a fan-in counted once per transaction";
-- functions/flows.sql; docs/src/flows.md → "Batches").
--
-- A batch is a flow: its callback is a child of every job of the batch,
-- with the `run` policy. What is new:
--
-- * `pgwake.batches`: one row per batch, keyed by the callback's job id.
--   `added` and `ended` count the batch's jobs and those that ended; each
--   is updated once per transaction that adds or ends jobs of the batch
--   (by the number it added or ended), at its commit, never per job.
--   `closed_at`: set by pgwake.batch_close; the callback is released in the
--   commit in which the batch is closed and `ended` = `added`. `summary`:
--   pgwake.batch_status as it was when the callback was released.
-- * `pgwake.job_parents.batch`: the edge of a batch's job to its callback.
--   Such an edge ends like a `run` edge but does not lower the callback's
--   `parents_open` one by one (quadratic when many end in one
--   transaction, and a row every completion fights over): it is counted.
-- * `pgwake.batch_checks`: one row per transaction and batch touched,
--   inserted by the first add or end of the batch in the transaction; its
--   deferred trigger applies the transaction's counts at commit, after
--   every parent's end in it.
--
-- Cost: a column added without a rewrite (constant default), a brief ACCESS
-- EXCLUSIVE lock on pgwake.job_parents; two new tables.
ALTER TABLE pgwake.job_parents ADD COLUMN IF NOT EXISTS batch boolean NOT NULL DEFAULT false;

CREATE TABLE IF NOT EXISTS pgwake.batches (
    id         bigint      PRIMARY KEY,
    opened_at  timestamptz NOT NULL DEFAULT now(),
    -- the rescuer closes a batch still open by then (pgwake.batch_open's
    -- close_within)
    close_by   timestamptz NOT NULL,
    closed_at  timestamptz,
    -- 'producer' (pgwake.batch_close) or 'timeout' (close_by passed)
    closed_by  text,
    added      bigint      NOT NULL DEFAULT 0,
    ended      bigint      NOT NULL DEFAULT 0,
    released_at timestamptz,
    summary    jsonb
);

-- Unlogged: a row lives from an add or end to the commit of its transaction.
CREATE UNLOGGED TABLE IF NOT EXISTS pgwake.batch_checks (
    batch bigint NOT NULL
);

-- pgwake.enqueue gains `batch` (functions/enqueue.sql).
DROP FUNCTION IF EXISTS pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval,
                                       text, text, boolean, text, text, text, bigint[], text);

-- The trigger's function (functions/flows.sql) must exist before the
-- trigger: a stub, replaced by the file applied after the migrations.
CREATE OR REPLACE FUNCTION pgwake.batch_check_trigger() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;

DROP TRIGGER IF EXISTS batch_checks_apply ON pgwake.batch_checks;
CREATE CONSTRAINT TRIGGER batch_checks_apply
    AFTER INSERT ON pgwake.batch_checks
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    EXECUTE FUNCTION pgwake.batch_check_trigger();

-- The rescuer's sweep closes batches left open past close_by.
CREATE INDEX IF NOT EXISTS batches_open_idx ON pgwake.batches (close_by) WHERE closed_at IS NULL;
