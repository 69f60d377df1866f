-- Delete dead jobs for good. $1: ids (NULL: any), $2: queue (NULL: any),
-- $3: only those that died more than this many seconds ago (NULL: any age).
DELETE FROM pgwake.dead_jobs
WHERE ($1::bigint[] IS NULL OR id = ANY($1))
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::float8 IS NULL OR failed_at < now() - make_interval(secs => $3))
