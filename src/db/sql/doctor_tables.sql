-- Doctor: pgwake's tables as the statistics have them (no count: the queue
-- may hold millions of rows): live and dead tuples, the last vacuum (either
-- kind) and its age in seconds, whether autovacuum is turned off for the
-- table (reloptions) and whether a vacuum runs on it now. Most dead tuples
-- first, at most $1.
SELECT s.relname::text AS table_name, s.n_live_tup AS live, s.n_dead_tup AS dead,
       extract(epoch FROM now() - greatest(s.last_autovacuum, s.last_vacuum))::float8
           AS vacuum_age,
       coalesce((SELECT lower(o.option_value) IN ('false', 'off', 'no', '0', 'f', 'n')
                 FROM pg_options_to_table(c.reloptions) o
                 WHERE o.option_name = 'autovacuum_enabled'), false) AS autovacuum_off,
       EXISTS (SELECT 1 FROM pg_stat_progress_vacuum p WHERE p.relid = s.relid) AS vacuuming
FROM pg_stat_user_tables s
JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = 'pgwake'
ORDER BY s.n_dead_tup DESC, s.relname
LIMIT $1
