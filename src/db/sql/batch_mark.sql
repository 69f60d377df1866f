-- Before a tx-mode batch's handlers start, on a connection outside the
-- claim transaction and committed durably: "the claim transaction $1 holds
-- the jobs $2". The claim transaction deletes this row in its own commit
-- (batch_clear.sql); a row that outlives its transaction marks a batch that
-- crashed or lost its connection while running.
INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id)
VALUES ($1::text::xid8, $2::bigint[], $3)
RETURNING token
