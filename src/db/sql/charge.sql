-- A suspect is about to run alone: charge the attempt where no rollback can
-- erase it (committed durably, on a connection outside the claim
-- transaction). Returns how many of its runs never reported, this one
-- included.
INSERT INTO pgwake.tx_attempts (job_id, charged) VALUES ($1, 1)
ON CONFLICT (job_id) DO UPDATE SET charged = pgwake.tx_attempts.charged + 1
RETURNING charged
