-- Record a tx-mode run's step (src/steps.rs) through the claim
-- transaction, which holds the job: it commits with the step's effects
-- and the job's outcome. $1 job id, $2 name, $3 output (JSON text,
-- bounded by the worker), $4 attempt. A name already recorded records
-- nothing (no row returned).
INSERT INTO pgwake.job_steps (job_id, name, output, attempt)
VALUES ($1, $2, $3::text::jsonb, $4)
ON CONFLICT (job_id, name) DO NOTHING
RETURNING recorded_at
