-- The queue tables' estimated rows (pg_class.reltuples, as the last
-- ANALYZE or VACUUM left it: no count), dead tuples and last vacuum;
-- finished_jobs summed over its partitions.
SELECT t.name,
       (SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::int8 FROM pg_class c
        WHERE c.oid = t.rel OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.rel)),
       (SELECT coalesce(sum(s.n_dead_tup), 0)::int8 FROM pg_stat_user_tables s
        WHERE s.relid = t.rel OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.rel)),
       (SELECT max(greatest(s.last_autovacuum, s.last_vacuum)) FROM pg_stat_user_tables s
        WHERE s.relid = t.rel OR s.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = t.rel))
FROM (VALUES ('jobs', 'pgwake.jobs'::regclass),
             ('leased_jobs', 'pgwake.leased_jobs'::regclass),
             ('dead_jobs', 'pgwake.dead_jobs'::regclass),
             ('finished_jobs', 'pgwake.finished_jobs'::regclass)) AS t(name, rel)
