-- Durable steps (migration 0040, issue 37 item 3): when a job's recorded
-- steps go. Re-applied by `pgwake migrate` when changed.

-- The steps of jobs that are gone (done without history, purged, or aged
-- out of the history), at most `batch` jobs' worth; returns how many rows
-- were deleted. Run by every worker's history maintenance
-- (src/services/history.rs), as pgwake.sweep_job_traces: a job is in
-- exactly one of these tables from the commit of each of its moves on, so
-- one snapshot never misses it. A tx-mode run's steps are written by its
-- claim transaction, which also holds the job: they are not seen before
-- the job's next move commits.
CREATE OR REPLACE FUNCTION pgwake.sweep_job_steps(batch bigint) RETURNS bigint
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM pgwake.job_steps s
        WHERE s.job_id = ANY(ARRAY(
            SELECT DISTINCT x.job_id FROM pgwake.job_steps x
            WHERE NOT EXISTS (SELECT FROM pgwake.jobs j WHERE j.id = x.job_id)
              AND NOT EXISTS (SELECT FROM pgwake.leased_jobs l WHERE l.id = x.job_id)
              AND NOT EXISTS (SELECT FROM pgwake.dead_jobs d WHERE d.id = x.job_id)
              AND NOT EXISTS (SELECT FROM pgwake.finished_jobs f WHERE f.id = x.job_id)
            LIMIT batch))
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
