-- Batch $1's progress (pgwake.batch_status, functions/flows.sql), as JSON
-- text.
SELECT pgwake.batch_status($1)::text
