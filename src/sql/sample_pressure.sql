-- Database pressure gauges, from the server's own statistics views (cheap:
-- one row per backend, one per table). Our own session is left out.
SELECT
    (SELECT coalesce(json_agg(json_build_array(app, n)), '[]'::json)
     FROM (SELECT coalesce(nullif(application_name, ''), 'unknown') AS app, count(*) AS n
           FROM pg_stat_activity
           WHERE datname = current_database()
             AND state IN ('idle in transaction', 'idle in transaction (aborted)')
             AND pid <> pg_backend_pid()
           GROUP BY 1) s) AS idle_in_tx,
    (SELECT coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8
     FROM pg_stat_activity
     WHERE datname = current_database()
       AND state IN ('idle in transaction', 'idle in transaction (aborted)')
       AND pid <> pg_backend_pid()) AS idle_in_tx_max_age,
    (SELECT coalesce(extract(epoch FROM max(now() - xact_start)), 0)::float8
     FROM pg_stat_activity
     WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()
       AND backend_type = 'client backend') AS oldest_tx_age,
    pg_notification_queue_usage()::float8 AS notify_queue_usage,
    (SELECT coalesce(n_dead_tup, 0) FROM pg_stat_user_tables
     WHERE relid = 'pgwake.jobs'::regclass) AS dead_tuples
