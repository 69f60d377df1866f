-- Outcomes are being written in the claim transaction: forget the pending
-- attempt counts of its jobs (atomically with those outcomes).
DELETE FROM pgwake.tx_attempts WHERE job_id = ANY($1::bigint[])
