-- pgwake schema, version 23: one reservation or keyed claim visits a
-- bounded number of limit keys (issue 24; ARCHITECTURE.md → "Fair keys: a
-- rotation between limit keys"). pgwake.fair_key_jobs and
-- pgwake.reserve_key_admissions gain a result column (`stop_key`: the last
-- key a walk cut by pgwake.key_walk_bound() visited, where the worker's
-- rotation resumes); CREATE OR REPLACE cannot change a result type, so the
-- definitions of functions/claims.sql, applied right after the
-- migrations, replace these.
--
-- Cost of this migration: none (two functions dropped; no table touched).
DROP FUNCTION IF EXISTS pgwake.fair_key_jobs(text, text, bigint, text[], text[], text[]);
DROP FUNCTION IF EXISTS pgwake.reserve_key_admissions(text, text, bigint, text[], text[], bigint);
