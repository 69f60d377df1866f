-- Before a tx-mode batch's handlers start, on a connection outside the
-- claim transaction: "the claim transaction $1 holds the jobs $2" — unless
-- one of them is a suspect, when nothing is marked and the suspects come
-- back instead (the claim then gives every job back and runs the suspects
-- alone, claim/tx/ledger.rs).
--
-- A job is a suspect when an earlier claim of it ended without an outcome:
-- it is charged in pgwake.tx_attempts, or named in the mark of a batch whose
-- claim transaction is over. This statement's snapshot is taken after the
-- claim statement returned, so after it locked the jobs: a crashed claim
-- held its jobs until it ended, and had committed its mark before its
-- handlers ran, so its mark is seen here. Marks are looked up by job
-- (the GIN index of migration 0035): a held vacuum horizon leaves every
-- finished batch's deleted mark in the table, and this reads none of them
-- but those naming the jobs just claimed.
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
--
-- Returns the mark's token (NULL when there are suspects) and the suspects.
WITH suspect AS (
    SELECT j.id FROM pgwake.tx_batches b, unnest(b.job_ids) AS j(id)
    WHERE b.job_ids && $2::bigint[] AND j.id = ANY($2::bigint[])
      AND pg_xact_status(b.xid) IS DISTINCT FROM 'in progress'
    UNION
    SELECT job_id FROM pgwake.tx_attempts WHERE job_id = ANY($2::bigint[])
),
mark AS (
    INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id, queues, key_queues, limit_keys)
    SELECT $1::text::xid8, $2::bigint[], $3, $4::text[], $5::text[], $6::text[]
    WHERE NOT EXISTS (SELECT FROM suspect)
    RETURNING token
)
SELECT (SELECT token FROM mark), ARRAY(SELECT id FROM suspect ORDER BY id)
