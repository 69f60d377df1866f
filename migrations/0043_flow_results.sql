-- pgwake schema, version 43: results along the edges of a flow (issue 36,
-- item 3; ARCHITECTURE.md → "Flows: a parent's result waits on its edges";
-- functions/flows.sql; docs/src/flows.md → "Results").
--
-- * `pgwake.job_parents.result`: the result a parent ended done with,
--   written by the worker's done write in the same transaction as the
--   parent's end (so it commits with the child's release), whatever the
--   history setting. Only a parent with children pays: the write updates
--   its edges, found by the primary key's prefix (parent).
-- * `pgwake.job_parents.error`: the error of a parent that ended dead or
--   cancelled, for a child that runs anyway (on_failure 'run'), written by
--   pgwake.settle_parent at the same commit.
--
-- Cost: two nullable columns added without a rewrite (no default), a brief
-- ACCESS EXCLUSIVE lock on pgwake.job_parents.
ALTER TABLE pgwake.job_parents ADD COLUMN IF NOT EXISTS result jsonb;
ALTER TABLE pgwake.job_parents ADD COLUMN IF NOT EXISTS error text;
