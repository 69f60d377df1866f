-- Why job $1 is not running: one row per reason (functions/jobs.sql).
SELECT reason, detail, until, blocking_job FROM pgwake.explain($1)
