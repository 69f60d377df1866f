-- The console's per-queue activity (src/admin/activity.rs): jobs running
-- now, jobs waiting out a retry backoff, and what the limits use. Cheap on any backlog: the (queue, priority)
-- pairs come from a loose index scan of jobs_queue_claim_idx; tx-mode
-- claims are recognised among the first $1 ready jobs of each pair in claim
-- order (where claims take their rows: rows deleted by a transaction still
-- in progress, as sample_queues.sql does), and retries (attempts > 0) among
-- the first $1 scheduled jobs of each pair; pgwake.leased_jobs,
-- pgwake.queue_slots and pgwake.queue_rate_slots hold only what runs or was
-- admitted. Reads only, takes no lock.
WITH RECURSIVE
    pairs AS (
        (SELECT queue, priority FROM pgwake.jobs ORDER BY queue, priority LIMIT 1)
        UNION ALL
        SELECT nxt.queue, nxt.priority
        FROM pairs p
        CROSS JOIN LATERAL (
            SELECT j.queue, j.priority FROM pgwake.jobs j
            WHERE (j.queue, j.priority) > (p.queue, p.priority)
            ORDER BY j.queue, j.priority
            LIMIT 1
        ) nxt
    ),
    locks AS MATERIALIZED (
        SELECT transactionid AS xid FROM pg_locks
        WHERE locktype = 'transactionid' AND granted
    ),
    tx AS (
        SELECT p.queue, count(*) AS n
        FROM pairs p
        CROSS JOIN LATERAL (
            SELECT j.xmax FROM pgwake.jobs j
            WHERE (j.queue, j.priority, j.run_at) >= (p.queue, p.priority, '-infinity')
              AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
            ORDER BY j.queue, j.priority, j.run_at, j.id
            LIMIT $1
        ) head
        WHERE head.xmax IN (SELECT xid FROM locks)
        GROUP BY p.queue
    ),
    retrying AS (
        SELECT p.queue, count(*) AS n
        FROM pairs p
        CROSS JOIN LATERAL (
            SELECT j.attempts FROM pgwake.jobs j
            WHERE (j.queue, j.priority, j.run_at) > (p.queue, p.priority, now())
              AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, 'infinity')
            ORDER BY j.queue, j.priority, j.run_at, j.id
            LIMIT $1
        ) later
        WHERE later.attempts > 0
        GROUP BY p.queue
    ),
    leased AS (
        SELECT queue, count(*) AS n FROM pgwake.leased_jobs GROUP BY queue
    ),
    slots AS (
        SELECT s.queue, count(*) AS n FROM pgwake.queue_slots s
        WHERE s.lease_token IS NOT NULL OR s.xmax IN (SELECT xid FROM locks)
        GROUP BY s.queue
    ),
    rates AS (
        SELECT rs.queue, count(*) AS n
        FROM pgwake.queue_rate_slots rs
        JOIN pgwake.queues q ON q.name = rs.queue
        WHERE q.rate_window IS NOT NULL AND rs.last_start > now() - q.rate_window
        GROUP BY rs.queue
    ),
    names AS (
        SELECT queue FROM tx UNION SELECT queue FROM leased UNION SELECT queue FROM retrying
        UNION SELECT queue FROM slots UNION SELECT queue FROM rates
        UNION SELECT name FROM pgwake.queues WHERE max_running IS NOT NULL
    )
SELECT n.queue,
       coalesce(leased.n, 0)::int8 AS leased,
       coalesce(tx.n, 0)::int8 AS tx_running,
       CASE WHEN q.max_running IS NULL THEN NULL
            ELSE coalesce(slots.n, 0) + pgwake.unslotted_running(n.queue) END::int8 AS slots_used,
       coalesce(rates.n, 0)::int8 AS rate_used,
       coalesce(retrying.n, 0)::int8 AS retrying
FROM names n
LEFT JOIN pgwake.queues q ON q.name = n.queue
LEFT JOIN tx ON tx.queue = n.queue
LEFT JOIN leased ON leased.queue = n.queue
LEFT JOIN slots ON slots.queue = n.queue
LEFT JOIN rates ON rates.queue = n.queue
LEFT JOIN retrying ON retrying.queue = n.queue
ORDER BY n.queue
