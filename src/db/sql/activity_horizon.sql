-- What holds back the vacuum horizon: the $1 sessions with the oldest
-- snapshot (backend_xmin) or transaction, then replication slots and
-- prepared transactions that keep an old xmin. Our own session is left out.
-- Sessions of other roles show their statement only to a role with
-- pg_read_all_stats (e.g. a member of pg_monitor).
SELECT * FROM (
    SELECT 'session'::text AS kind, pid, coalesce(nullif(application_name, ''), backend_type) AS who,
           state, greatest(0, extract(epoch FROM now() - xact_start))::float8 AS xact_age,
           age(backend_xmin)::int8 AS xmin_age, left(query, 2000) AS query
    FROM pg_stat_activity
    WHERE pid <> pg_backend_pid() AND (backend_xmin IS NOT NULL OR xact_start IS NOT NULL)
    ORDER BY age(backend_xmin) DESC NULLS LAST, xact_start
    LIMIT $1
) s
UNION ALL
SELECT 'replication slot', NULL, slot_name::text, CASE WHEN active THEN 'active' ELSE 'inactive' END,
       NULL, greatest(age(xmin), age(catalog_xmin))::int8, NULL
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
UNION ALL
SELECT 'prepared transaction', NULL, gid, 'prepared',
       greatest(0, extract(epoch FROM now() - prepared))::float8, age(transaction)::int8, NULL
FROM pg_prepared_xacts
