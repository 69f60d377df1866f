-- Waits (migration 0041) of jobs that are gone (done, or purged
-- from dead_jobs) go a week after their last wait, at most 10,000 a
-- rescue round: a range of job_waits_at_idx. A job still waiting,
-- running or dead keeps its row.
DELETE FROM pgwake.job_waits
WHERE ctid = ANY (ARRAY(
    SELECT s.ctid FROM pgwake.job_waits s
    WHERE s.waited_at < now() - interval '7 days'
      AND NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = s.job_id)
      AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = s.job_id)
      AND NOT EXISTS (SELECT 1 FROM pgwake.dead_jobs d WHERE d.id = s.job_id)
    LIMIT 10000))
