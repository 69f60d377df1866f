-- Kept signals (pgwake.signals, migration 0042) for keys that jobs just
-- began to wait for are delivered now (functions/signals.sql). $1 the keys.
SELECT pgwake.take_kept_signals($1::text[])
