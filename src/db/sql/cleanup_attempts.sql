-- Crash charges of jobs that are gone (done, dead, leased, deleted by hand):
-- nothing will read them again. A job held by a running claim is still
-- visible here (its deletion is uncommitted), so its charges stay.
DELETE FROM pgwake.tx_attempts a
WHERE NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = a.job_id)
