-- Doctor: prepared transactions (two-phase commit) of this database, which
-- hold the vacuum horizon and their locks until someone commits or rolls
-- them back, oldest first, at most $1.
SELECT gid, coalesce(owner::text, '') AS owner,
       greatest(0, extract(epoch FROM now() - prepared))::float8 AS age,
       age(transaction)::int8 AS xmin_age
FROM pg_prepared_xacts
WHERE database = current_database()
ORDER BY prepared, gid
LIMIT $1
