-- Record a lease-mode run's step (src/steps.rs), on the worker's pool,
-- before JobContext::step returns: $1 job id, $2 name, $3 output (JSON
-- text, bounded by the worker), $4 attempt, $5 the run's claim token.
--
-- Fenced by the lease: written only while the token holds the job's
-- lease, whose row is locked FOR SHARE so that a rescue or a requeue
-- (which delete it) cannot pass between the check and the insert. A run
-- that lost its lease records nothing (no row returned), nor does a name
-- already recorded.
INSERT INTO pgwake.job_steps (job_id, name, output, attempt)
SELECT $1, $2, $3::text::jsonb, $4
WHERE EXISTS (
    SELECT 1 FROM pgwake.leased_jobs l
    WHERE l.id = $1 AND l.token = $5
    FOR SHARE)
ON CONFLICT (job_id, name) DO NOTHING
RETURNING recorded_at
