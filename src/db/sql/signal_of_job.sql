-- How the job's last wait for a signal ended, for JobContext::signal: its
-- state ('waiting': it runs without a signal, so timed out; 'received')
-- and the payload as JSON text. No row: its last wait (if any) was not
-- for a signal. $1 the job.
SELECT w.signal_state, w.signal_payload::text
FROM pgwake.job_waits w
WHERE w.job_id = $1 AND w.kind = 'signal'
