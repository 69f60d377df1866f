-- The console's words for a job held at its limit key's running limit
-- ("waiting for a slot of key 'acme': 2 of 2 running", src/console/reasons.rs):
-- per (queue, limit key) pair of $1 and $2, the key's running jobs as its
-- limit counts them, as activity_queues.sql counts a queue's slots: key
-- slots held (a lease's token, or a tx claim's row lock) and the key's jobs
-- running without a slot (pgwake.unslotted_key_running). One primary-key
-- range of pgwake.key_slots per pair; reads only, takes no lock.
WITH locks AS MATERIALIZED (
    SELECT transactionid AS xid FROM pg_locks
    WHERE locktype = 'transactionid' AND granted
)
SELECT k.queue, k.limit_key,
       ((SELECT count(*) FROM pgwake.key_slots s
         WHERE s.queue = k.queue AND s.limit_key = k.limit_key
           AND (s.lease_token IS NOT NULL OR s.xmax IN (SELECT xid FROM locks)))
        + pgwake.unslotted_key_running(k.queue, k.limit_key))::int8 AS running
FROM unnest($1::text[], $2::text[]) AS k(queue, limit_key)
