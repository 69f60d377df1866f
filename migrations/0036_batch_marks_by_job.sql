-- The crash check reads marks by job only under pressure (issue 35).
--
-- Migration 0035 indexed every mark's job ids (GIN) so that the check could
-- look marks up by the jobs just claimed, however many dead marks a held
-- vacuum horizon keeps. But a GIN entry per claimed job is paid by every
-- tx batch, pressure or not: the tx no-op fast path fell to 0.84x. Now the
-- worker chooses per claim (src/claim/tx/ledger.rs): without pressure it
-- reads every mark, pipelined with the claim, as before 0035 (a few live
-- marks, since vacuum keeps up), and writes a plain mark; under pressure
-- it writes its marks `by_job`, and only those get GIN entries (a partial
-- index). The check under pressure reads `by_job` marks through the GIN
-- index and the others through a partial b-tree of their own: marks
-- written before the worker saw the pressure, a bounded number, since no
-- new ones are written while it lasts.
-- IF [NOT] EXISTS throughout: the upgrade tests replay migrations.
ALTER TABLE pgwake.tx_batches ADD COLUMN IF NOT EXISTS by_job boolean NOT NULL DEFAULT false;
DROP INDEX IF EXISTS pgwake.tx_batches_job_ids;
-- fastupdate off: a pending list would be read whole by every lookup.
CREATE INDEX IF NOT EXISTS tx_batches_by_job ON pgwake.tx_batches USING gin (job_ids)
    WITH (fastupdate = off) WHERE by_job;
CREATE INDEX IF NOT EXISTS tx_batches_not_by_job ON pgwake.tx_batches (token) WHERE NOT by_job;
