-- Count an attempt for each claimed job before its handler starts, on a
-- connection outside the claim transaction (see migrations/0001 on
-- pgwake.tx_attempts). Returns how many attempts of each job never reported
-- an outcome, this one included.
INSERT INTO pgwake.tx_attempts (job_id, attempts)
SELECT unnest($1::bigint[]), 1
ON CONFLICT (job_id) DO UPDATE SET attempts = pgwake.tx_attempts.attempts + 1
RETURNING job_id, attempts
