-- Progress rows (migration 0037) of runs that are over — their worker was
-- killed mid-job, or lost its connection before it cleared them — at most
-- 10,000 a rescue round. Readers never show them
-- (pgwake.progress_current); this keeps the table as small as the number
-- of running jobs that report progress.
DELETE FROM pgwake.job_progress
WHERE ctid = ANY (ARRAY(
    SELECT p.ctid FROM pgwake.job_progress p
    WHERE NOT pgwake.progress_current(p.job_id, p.token, p.xid)
    LIMIT 10000))
