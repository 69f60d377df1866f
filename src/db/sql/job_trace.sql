-- Job $1's W3C trace context (migration 0038, functions/traces.sql). No
-- row: it was enqueued without one, or it is gone.
SELECT traceparent, tracestate FROM pgwake.job_traces WHERE job_id = $1
