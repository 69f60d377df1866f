-- Extend a lease we still hold. No row: the lease expired and the job was
-- rescued (it may be running elsewhere): the caller stops.
UPDATE pgwake.leased_jobs
SET lease_until = now() + make_interval(secs => $3)
WHERE id = $1 AND attempts = $2
RETURNING lease_until
