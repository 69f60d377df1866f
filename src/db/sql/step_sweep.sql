-- The steps of jobs that are gone, at most $1 jobs' worth (history
-- maintenance, src/services/history.rs; functions/steps.sql).
SELECT pgwake.sweep_job_steps($1::bigint)
