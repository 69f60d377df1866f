-- The queues with a setting (migrations 0009, 0010): paused ones, for the
-- pgwake_queue_paused gauge and `pgwake stats`; limited ones with their
-- max_running, for the pgwake_queue_max_running gauge; rate-limited ones
-- with their rate in admissions per second, for pgwake_queue_rate_limit;
-- per-key limited ones (migration 0020) for
-- pgwake_queue_max_running_per_key. A
-- primary-key-sized table: one sequential scan.
SELECT name, paused, max_running,
       rate_count / nullif(extract(epoch FROM rate_window)::float8, 0) AS rate_per_second,
       max_running_per_key
FROM pgwake.queues
WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL
   OR max_running_per_key IS NOT NULL
ORDER BY name
