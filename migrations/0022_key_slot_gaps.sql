-- pgwake schema, version 22: per-key running limits (migration 0020)
-- count the jobs already running when a limit is set, and the slot rows of
-- keys that have no job any more are swept (issue 24; ARCHITECTURE.md →
-- "Limit keys").
--
-- A job that runs without a key slot (claimed while its key had no limit)
-- counts against a limit set while it runs, as pgwake.unslotted_running
-- counts the queue's (migration 0015): lease-mode ones are the leases with
-- a limit key and `holds_key_slot` false (the partial index below finds
-- them, and is empty in the steady state of a limited queue); tx-mode ones
-- are named here by their batch's mark (src/db/sql/batch_mark.sql): the
-- queue and limit key of each job of the batch that has a key and holds no
-- key slot, in two arrays of the same length (NULL: none).
--
-- Cost of this migration: two columns without a default (no rewrite), an
-- index on pgwake.leased_jobs (running jobs only), and a partial index on
-- pgwake.jobs over held jobs that have a limit key, built in one pass of
-- the table (inserts wait for it: seconds for millions of waiting jobs).
ALTER TABLE pgwake.tx_batches
    ADD COLUMN key_queues text[],
    ADD COLUMN limit_keys text[];

CREATE INDEX leased_jobs_unslotted_key_idx ON pgwake.leased_jobs (queue, limit_key)
    WHERE limit_key IS NOT NULL AND NOT holds_key_slot;

-- The sweep of slot rows (functions/rescue.sql, pgwake.sweep_key_slots)
-- keeps a key's rows while any job of the key waits: the ready and
-- scheduled ones are in jobs_limit_key_ready_idx (migration 0020), the held
-- ones (behind an earlier job of their ordering key) here.
CREATE INDEX jobs_limit_key_held_idx ON pgwake.jobs (queue, limit_key COLLATE "C")
    WHERE held AND limit_key IS NOT NULL;

-- pgwake.fair_key_jobs gains a result column (`repair_key`: a key whose
-- slot rows went missing); CREATE OR REPLACE cannot change a result type,
-- so the definition of functions/claims.sql, applied right after the
-- migrations, replaces this one.
DROP FUNCTION IF EXISTS pgwake.fair_key_jobs(text, text, bigint, text[], text[], text[]);
