-- Which of the jobs this worker runs ($1) have a cancel request.
SELECT job_id FROM pgwake.cancel_requests WHERE job_id = ANY($1::bigint[])
