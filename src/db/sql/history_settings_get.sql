-- The history setting (seconds to keep finished jobs; NULL: history off).
-- Always one row: a settings row that someone deleted reads as "off".
SELECT (SELECT extract(epoch FROM keep)::float8 FROM pgwake.history_settings)
