-- Inside a suspect's claim transaction, with its outcome: its crash charges
-- are folded into the outcome (or it is done); forget them.
DELETE FROM pgwake.tx_attempts WHERE job_id = ANY($1::bigint[])
