-- The console's charts: per minute of the last $1 seconds, of queue $2
-- (NULL: every queue), jobs per outcome and the pickup latency's mean and
-- maximum. Minutes without a row are absent.
SELECT extract(epoch FROM minute)::int8 / 60,
       coalesce(sum(jobs) FILTER (WHERE outcome = 'done'), 0)::int8,
       coalesce(sum(jobs) FILTER (WHERE outcome = 'retry'), 0)::int8,
       coalesce(sum(jobs) FILTER (WHERE outcome IN ('dead', 'cancelled')), 0)::int8,
       (sum(pickup_seconds_sum) / nullif(sum(jobs), 0))::float8,
       max(pickup_seconds_max)::float8
FROM pgwake.minute_stats
WHERE minute >= date_trunc('minute', now() - make_interval(secs => $1))
  AND ($2::text IS NULL OR queue = $2)
GROUP BY minute
ORDER BY minute
