-- Right after a tx-mode claim, in its transaction, while the database is
-- not under pressure (a new statement, so a new snapshot, taken after the
-- claim locked its rows): the jobs that must run alone. A job is a suspect
-- when an earlier claim of it ended without an outcome: it is in
-- pgwake.tx_attempts, or in the mark of a batch whose claim transaction is
-- over. (Checked inside the claim statement, a mark committed after that
-- statement's snapshot but before the crashed claim let go of the row
-- would be missed.) Both tables hold only in-flight batches and unresolved
-- suspects while vacuum keeps up: a few rows, read whole, pipelined with
-- the claim (no round trip of its own). While a long transaction holds the
-- vacuum horizon every finished batch's mark stays, dead, and this read
-- would grow with them: under pressure the check is made by job instead
-- (batch_mark_by_job.sql).
SELECT unnest(job_ids) FROM pgwake.tx_batches
WHERE pg_xact_status(xid) IS DISTINCT FROM 'in progress'
UNION
SELECT job_id FROM pgwake.tx_attempts
