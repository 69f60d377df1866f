-- The governor's changes of level in the last $1 seconds, newest first, at
-- most $2 (pgwake.pressure_log keeps a day).
SELECT at, level, previous, causes, actions
FROM pgwake.pressure_log
WHERE at >= now() - make_interval(secs => $1)
ORDER BY at DESC, id DESC
LIMIT $2
