-- The recorded steps of job $1 (migration 0040): name, output (JSON
-- text), the attempt that recorded it, when. Read by a run's first
-- JobContext::step (through the claim transaction in tx mode) and by
-- `pgwake job show` and the console's job page.
SELECT name, output::text, attempt, recorded_at
FROM pgwake.job_steps
WHERE job_id = $1
ORDER BY recorded_at, name
