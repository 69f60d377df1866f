-- pgwake schema, version 21: rate limits per limit key (issue 24; `pgwake
-- queue set Q --rate-per-key N/s`, pgwake.set_queue_rate_per_key();
-- ARCHITECTURE.md → "Rate limits per key").
--
-- At most key_rate_count jobs of any one limit key of the queue are
-- admitted in any window of key_rate_window (sliding), across every worker:
-- the queue rate's admission clock (migration 0010), kept per key. NULL in
-- both: no per-key rate. Jobs without a key are not limited by it.
ALTER TABLE pgwake.queues
    ADD COLUMN key_rate_count  integer
        CONSTRAINT queues_key_rate_count_valid CHECK (key_rate_count BETWEEN 1 AND 100000),
    ADD COLUMN key_rate_window interval
        CONSTRAINT queues_key_rate_window_valid CHECK (key_rate_window > interval '0'),
    ADD CONSTRAINT queues_key_rate_complete CHECK ((key_rate_count IS NULL) = (key_rate_window IS NULL));

-- Admission slots of one limit key, numbered 1..key_rate_count, as
-- pgwake.queue_rate_slots is per queue: a slot admits one job when its last
-- admission is at least a window old and then holds the new admission's
-- time, so no window holds more than key_rate_count admissions of the key.
--
-- Taken by pgwake.reserve_key_admissions (functions/claims.sql) in a short
-- autocommit statement before the claim, never inside a tx-mode claim
-- transaction (a rollback after a crash would forget runs whose handlers
-- already called out); the claim takes at most the admitted number of jobs
-- per key, and what it did not use is given back with `prev_start`
-- (src/db/sql/key_rate_release.sql). Rows are created by the reservation
-- itself, one per admission a key needs beyond its free ones (a key that
-- never runs more than one job a window has one row), and rows idle for a
-- window and a minute are deleted by later reservations.
CREATE TABLE pgwake.key_rate_slots (
    queue      text        NOT NULL REFERENCES pgwake.queues (name) ON DELETE CASCADE,
    limit_key  text        NOT NULL,
    slot       integer     NOT NULL CHECK (slot > 0),
    last_start timestamptz NOT NULL DEFAULT '-infinity',
    prev_start timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (queue, limit_key, slot)
);
-- A key's oldest admission first (the reservation), and the queue's idle
-- rows (the clean-up).
CREATE INDEX key_rate_slots_oldest_idx ON pgwake.key_rate_slots (queue, limit_key, last_start);
CREATE INDEX key_rate_slots_idle_idx ON pgwake.key_rate_slots (queue, last_start);

-- pgwake.fair_key_jobs gains the keys admitted for the claim (functions/
-- claims.sql defines it right after this migration); a new argument would
-- make a second function beside the old one.
DROP FUNCTION IF EXISTS pgwake.fair_key_jobs(text, text, bigint, text[], text[]);
