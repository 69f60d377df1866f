-- The history setting (seconds to keep finished jobs; NULL: history off).
SELECT extract(epoch FROM keep)::float8 FROM pgwake.history_settings
