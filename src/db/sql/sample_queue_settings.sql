-- The queues with a setting (migrations 0009, 0010): paused ones, for the
-- pgwake_queue_paused gauge and `pgwake stats`; limited ones with their
-- max_running, for the pgwake_queue_max_running gauge; rate-limited ones
-- with their rate in admissions per second, for pgwake_queue_rate_limit;
-- per-key limited ones (migration 0020) for
-- pgwake_queue_max_running_per_key; those with a per-key rate (migration
-- 0021) for pgwake_queue_rate_per_key_limit; fair-keys ones for
-- pgwake_queue_fair_keys; those the governor paused (`paused_by`, migration
-- 0032) for pgwake_queue_shed. A primary-key-sized table: one sequential scan.
SELECT name, paused, max_running,
       rate_count / nullif(extract(epoch FROM rate_window)::float8, 0) AS rate_per_second,
       max_running_per_key,
       key_rate_count / nullif(extract(epoch FROM key_rate_window)::float8, 0)
           AS key_rate_per_second,
       fair_keys,
       paused AND paused_by IS NOT DISTINCT FROM 'pressure' AS shed
FROM pgwake.queues
WHERE paused OR max_running IS NOT NULL OR rate_count IS NOT NULL
   OR max_running_per_key IS NOT NULL OR key_rate_count IS NOT NULL OR fair_keys
ORDER BY name
