-- The console's depth chart: per minute of the last $1 seconds, of queue
-- $2 (NULL: every queue summed), ready and scheduled jobs as sampled.
SELECT extract(epoch FROM minute)::int8 / 60, sum(ready)::int8, sum(scheduled)::int8
FROM pgwake.minute_depth
WHERE minute >= date_trunc('minute', now() - make_interval(secs => $1))
  AND ($2::text IS NULL OR queue = $2)
GROUP BY minute
ORDER BY minute
