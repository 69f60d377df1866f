-- pgwake schema, version 42: waits for a signal (issue 37, item 4).
-- A handler may end a run with `Outcome::WaitFor { signal, timeout }`: the
-- job goes back to pgwake.jobs due at its timeout (out of the claim path,
-- holding no slot, as a sleep: migration 0041) and its wait is recorded in
-- pgwake.job_waits with kind 'signal' and these columns:
--
--   signal_key      the key it waits for (1-1024 bytes, no control characters)
--   signal_state    'waiting' until a signal for the key arrives, then
--                   'received' (with signal_payload, signalled_at); a job
--                   that runs while still 'waiting' timed out
--   signal_payload  the signal's payload (NULL: none given)
--   signalled_at    when the signal reached it
--
-- `pgwake.signal(key, payload)` (functions/signals.sql) marks every job
-- waiting for the key 'received' and makes it due now. A signal that woke
-- no job is kept in pgwake.signals (one row per key, the latest payload)
-- until its keep_until (24 hours by default): the first wait for its key
-- takes it and resumes at once. The rescuer deletes expired rows and, past
-- 100,000 kept signals, the oldest (src/db/sql/signals_expire.sql).
--
-- Cost: three NULL columns on a table only waits write, a partial index of
-- the jobs waiting for a signal, and a new, empty table. Numbers 41 and 43
-- are other branches'.

ALTER TABLE pgwake.job_waits
    ADD COLUMN IF NOT EXISTS signal_key text,
    ADD COLUMN IF NOT EXISTS signal_state text,
    ADD COLUMN IF NOT EXISTS signal_payload jsonb,
    ADD COLUMN IF NOT EXISTS signalled_at timestamptz;
CREATE INDEX IF NOT EXISTS job_waits_signal_idx ON pgwake.job_waits (signal_key)
    WHERE signal_state = 'waiting';

CREATE TABLE IF NOT EXISTS pgwake.signals (
    key        text PRIMARY KEY,
    payload    jsonb,
    sent_at    timestamptz NOT NULL DEFAULT now(),
    keep_until timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS signals_keep_idx ON pgwake.signals (keep_until);
CREATE INDEX IF NOT EXISTS signals_sent_idx ON pgwake.signals (sent_at);
