-- `pgwake stats`: per queue, the outcomes counted by the rollup over the
-- last $1 seconds (whole minutes: from the start of the minute $1 seconds
-- ago), and the pickup latency's mean and maximum.
SELECT queue,
       coalesce(sum(jobs) FILTER (WHERE outcome = 'done'), 0)::int8,
       coalesce(sum(jobs) FILTER (WHERE outcome = 'retry'), 0)::int8,
       coalesce(sum(jobs) FILTER (WHERE outcome IN ('dead', 'cancelled')), 0)::int8,
       (sum(pickup_seconds_sum) / nullif(sum(jobs), 0))::float8,
       max(pickup_seconds_max)::float8
FROM pgwake.minute_stats
WHERE minute >= date_trunc('minute', now() - make_interval(secs => $1))
GROUP BY queue
ORDER BY queue
