-- Bench: per pgwake table, the row versions made dead so far (updates and
-- deletes; cumulative, never reset by vacuum) and the dead tuples still
-- waiting for vacuum.
SELECT relname::text,
       (n_tup_upd + n_tup_del)::float8 AS dead_made,
       n_dead_tup::float8 AS dead_now
FROM pg_stat_user_tables
WHERE schemaname = 'pgwake' AND relname <> 'schema_migrations'
ORDER BY relname
