-- Doctor: the server's settings and counters the checks read, in one row:
-- autovacuum and track_counts, the connection limit and how many client
-- sessions there are (every database), the NOTIFY queue's use, whether this
-- role sees other roles' sessions (pg_read_all_stats: superusers and
-- pg_monitor members do) and how many of them it cannot see.
SELECT current_setting('autovacuum') = 'on' AS autovacuum,
       current_setting('track_counts') = 'on' AS track_counts,
       current_setting('max_connections')::int4 AS max_connections,
       current_setting('superuser_reserved_connections')::int4 AS superuser_reserved,
       coalesce(current_setting('reserved_connections', true), '0')::int4 AS reserved,
       (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')::int8
           AS sessions,
       pg_notification_queue_usage()::float8 AS notify_usage,
       pg_has_role('pg_read_all_stats', 'USAGE') AS sees_all,
       (SELECT count(*) FROM pg_stat_activity
        WHERE backend_type = 'client backend' AND query = '<insufficient privilege>')::int8
           AS hidden_sessions,
       current_user::text AS role, current_database()::text AS database
