-- Database pressure gauges, from the server's own statistics views (cheap:
-- one row per backend, one per table). Our own session, which runs this in a
-- transaction, is left out. Ages are clamped at 0: a transaction that began
-- after ours has a start later than our now(). Only this database's
-- sessions: a transaction in another database does not hold back the
-- horizon of this one's tables, and counting it
-- made claims here resume after their cursor for nothing.
--
-- Sessions of other roles show their state only to a role with
-- pg_read_all_stats (e.g. a member of pg_monitor); without it their idle
-- transactions are not seen.
SELECT
    (SELECT coalesce(json_agg(json_build_array(app, n)), '[]'::json)
     FROM (SELECT coalesce(nullif(application_name, ''), 'unknown') AS app, count(*) AS n
           FROM pg_stat_activity
           WHERE datname = current_database()
             AND state IN ('idle in transaction', 'idle in transaction (aborted)')
             AND pid <> pg_backend_pid()
           GROUP BY 1) s) AS idle_in_tx,
    (SELECT greatest(0, coalesce(extract(epoch FROM max(now() - xact_start)), 0))::float8
     FROM pg_stat_activity
     WHERE datname = current_database()
       AND state IN ('idle in transaction', 'idle in transaction (aborted)')
       AND pid <> pg_backend_pid()) AS idle_in_tx_max_age,
    (SELECT greatest(0, coalesce(extract(epoch FROM max(now() - xact_start)), 0))::float8
     FROM pg_stat_activity
     WHERE datname = current_database()
       AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
       AND backend_type = 'client backend') AS oldest_tx_age,
    pg_notification_queue_usage()::float8 AS notify_queue_usage,
    coalesce((SELECT n_dead_tup FROM pg_stat_user_tables
              WHERE relid = 'pgwake.jobs'::regclass), 0) AS dead_tuples,
    -- malformed trace contexts ignored (a sequence as a counter, migration 0038)
    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END
     FROM pgwake.trace_context_rejected) AS trace_context_rejected
