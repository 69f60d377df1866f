-- History maintenance, first statement of its transaction: the setting
-- (seconds to keep; NULL: history off, also when the settings row is
-- missing) and whether this worker is the one maintaining right now (a
-- transaction-level advisory lock, never waited for: another worker holding
-- it is doing the same work).
SELECT (SELECT extract(epoch FROM keep)::float8 FROM pgwake.history_settings),
       pg_try_advisory_xact_lock(7451952463380246118)
