-- Every recorded error of job $1, by attempt (migration 0019).
SELECT attempt, error, at FROM pgwake.job_errors WHERE job_id = $1 ORDER BY attempt
