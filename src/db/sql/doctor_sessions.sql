-- Doctor: the sessions that hold back the vacuum horizon of this database's
-- tables, oldest transaction first, at most $1: a snapshot (backend_xmin)
-- or a transaction id (backend_xid). Since PostgreSQL 14 a table's horizon
-- counts only the sessions of its own database (and WAL senders), so other
-- databases' sessions are left out, as are autovacuum's own short
-- snapshots and our own session. Other roles' sessions show their state,
-- xmin and statement only to a role with pg_read_all_stats: without it
-- they are not seen here (the stats.visibility finding says so).
SELECT pid, coalesce(nullif(application_name, ''), backend_type) AS who,
       coalesce(usename::text, '') AS role, coalesce(state, '') AS state,
       greatest(0, extract(epoch FROM now() - coalesce(xact_start, backend_start)))::float8 AS age,
       age(coalesce(backend_xmin, backend_xid))::int8 AS xmin_age,
       left(query, 200) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND backend_type IN ('client backend', 'walsender')
  AND (datname = current_database() OR backend_type = 'walsender')
  AND (backend_xmin IS NOT NULL OR backend_xid IS NOT NULL)
ORDER BY xact_start NULLS LAST, pid
LIMIT $1
