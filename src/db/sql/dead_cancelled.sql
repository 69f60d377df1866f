-- How many cancelled jobs a dead-job selection covers: those a retry of
-- `--all` leaves cancelled. $1: ids (NULL: every one), $2: queue (NULL: any).
SELECT count(*) FROM pgwake.dead_jobs
WHERE ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR queue = $2)
  AND last_error = 'cancelled'
