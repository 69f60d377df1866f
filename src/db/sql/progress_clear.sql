-- The progress rows of runs that ended on this worker (claim/run/progress.rs),
-- each only if the row is still that run's: $1 job ids, $2 claim tokens
-- (lease runs; NULL for tx runs), $3 claim transactions as text (tx runs).
DELETE FROM pgwake.job_progress p
USING unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(job_id, token, xid)
WHERE p.job_id = u.job_id
  AND p.token IS NOT DISTINCT FROM u.token
  AND p.xid IS NOT DISTINCT FROM u.xid::xid8
