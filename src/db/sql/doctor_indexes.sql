-- Doctor: the indexes of pgwake's tables, largest first, at most $1: their
-- size in bytes and the live rows of their table (statistics, no count),
-- from which the check estimates what the index would take unbloated.
SELECT quote_ident(ic.relname) AS index_name, quote_ident(t.relname) AS table_name,
       pg_relation_size(i.indexrelid)::int8 AS bytes,
       greatest(coalesce(s.n_live_tup, 0), t.reltuples::int8, 0) AS live
FROM pg_index i
JOIN pg_class ic ON ic.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
LEFT JOIN pg_stat_user_tables s ON s.relid = t.oid
WHERE n.nspname = 'pgwake'
ORDER BY pg_relation_size(i.indexrelid) DESC, ic.relname
LIMIT $1
