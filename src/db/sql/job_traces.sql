-- The W3C trace contexts of claimed jobs $1 (migration 0038), read once per
-- claim when tracing is on (src/trace.rs); jobs without one have no row.
SELECT job_id, traceparent, tracestate FROM pgwake.job_traces WHERE job_id = ANY($1)
