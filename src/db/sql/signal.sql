-- Send a signal (functions/signals.sql): $1 the key, $2 the payload as
-- JSON text (NULL: none), $3 seconds to keep it when it wakes no job.
-- Returns how many jobs it woke.
SELECT pgwake.signal($1::text, $2::text::jsonb, make_interval(secs => $3::float8))
