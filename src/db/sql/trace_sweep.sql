-- Delete the trace contexts of jobs that are gone (functions/traces.sql),
-- at most $1 of them; returns how many.
SELECT pgwake.sweep_job_traces($1::bigint)
