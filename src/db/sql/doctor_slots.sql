-- Doctor: replication slots that hold something back: an xmin (the vacuum
-- horizon of every table: a physical slot of a standby with
-- hot_standby_feedback), a catalog_xmin (a logical slot: the catalogs), and
-- the WAL from their restart_lsn on. Inactive first (nothing consumes
-- them, so they never advance), at most $1.
SELECT slot_name::text, slot_type, active,
       age(xmin)::int8 AS xmin_age, age(catalog_xmin)::int8 AS catalog_xmin_age,
       CASE WHEN restart_lsn IS NULL OR pg_is_in_recovery() THEN NULL
            ELSE pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8 END AS wal_bytes,
       coalesce(database::text, '') AS database
FROM pg_replication_slots
ORDER BY active, greatest(age(xmin), age(catalog_xmin)) DESC NULLS LAST, slot_name
LIMIT $1
