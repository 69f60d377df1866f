-- Renew every lease this worker still holds, in one statement ($1 tokens,
-- $2 lease seconds). A token missing from the result lost its lease (it
-- expired and was rescued; the job may be running elsewhere): its run stops.
UPDATE pgwake.leased_jobs
SET lease_until = now() + make_interval(secs => $2)
WHERE token = ANY($1::bigint[])
RETURNING token
