-- Before a tx-mode batch's handlers start, on a connection outside the
-- claim transaction, while the database is not under pressure: "the claim
-- transaction $1 holds the jobs $2". The crash check has already run, in
-- the claim transaction (suspects.sql); under pressure the mark and the
-- check are one statement that reads marks by job instead
-- (batch_mark_by_job.sql). Not `by_job`: no GIN entry per job (migration
-- 0036).
--
-- Committed asynchronously (claim/tx/ledger.rs): made durable before a
-- handler first uses the database (batch_mark_durable.sql), the only way a
-- job can crash the server; a worker crash leaves the server, and the mark,
-- alone. The claim transaction deletes this row in its own commit
-- (batch_clear.sql); a row that outlives its transaction marks a batch that
-- crashed or lost its connection while running. $4: the queue of each job
-- when the batch holds no queue slots (a plain claim), so that a
-- max_running limit set while it runs counts its jobs (migration 0015);
-- NULL when its jobs hold slots. $5, $6: the queue and limit key of each
-- job that has a limit key and holds no key slot (claimed while its key had
-- no limit), so that a per-key limit set while it runs counts it
-- (migration 0022); NULL: none.
INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id, queues, key_queues, limit_keys)
VALUES ($1::text::xid8, $2::bigint[], $3, $4::text[], $5::text[], $6::text[])
RETURNING token
