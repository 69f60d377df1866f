-- pgwake schema, version 10: rate limits per queue (`pgwake queue set Q
-- --rate N/s`, pgwake.set_queue_rate()).
--
-- A rate limit is "at most rate_count jobs of the queue are admitted in any
-- window of rate_window", across every worker: a sliding window, not a
-- calendar one (ARCHITECTURE.md → Rate limits). NULL in both: no limit.
ALTER TABLE pgwake.queues
    ADD COLUMN rate_count  integer  CHECK (rate_count BETWEEN 1 AND 100000),
    ADD COLUMN rate_window interval CHECK (rate_window > interval '0'),
    ADD CONSTRAINT queues_rate_complete CHECK ((rate_count IS NULL) = (rate_window IS NULL));

-- One row per admission slot of a rate-limited queue, numbered
-- 1..rate_count. A slot admits one job when its last admission is at least
-- rate_window old (`last_start <= now() - rate_window`) and then holds the
-- new admission's time; so no slot admits twice within one window, and no
-- window holds more than rate_count admissions.
--
-- Admissions are taken by a short autocommit statement just before the
-- claim (src/sql/rate_reserve.sql), never inside a tx-mode claim
-- transaction: a claim that crashes or rolls back after its jobs started
-- still counts (the external calls its handlers made happened), and the
-- slots are never locked for as long as a job runs. An admission the claim
-- did not use (fewer ready jobs than reserved) is given back with
-- `prev_start` (src/sql/rate_release.sql), only if no one has reused the
-- slot since.
CREATE TABLE pgwake.queue_rate_slots (
    queue      text        NOT NULL REFERENCES pgwake.queues (name) ON DELETE CASCADE,
    slot       integer     NOT NULL CHECK (slot > 0),
    last_start timestamptz NOT NULL DEFAULT '-infinity',
    prev_start timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (queue, slot)
);
-- The reservation takes the oldest admissions first and stops at the first
-- one younger than a window: a range scan of this index, however many slots
-- the queue has (without it, --rate 100000/s read and sorted every slot row
-- on every claim: 75 ms).
CREATE INDEX queue_rate_slots_oldest_idx ON pgwake.queue_rate_slots (queue, last_start);
