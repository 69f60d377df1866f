-- Queue gauges per queue: ready and scheduled depth, dead jobs, and the age
-- of the oldest ready job. $1: the depth cap (each count stops there);
-- $2: the running-claim window (see `ready` below).
--
-- The cost is bounded by the cap, not by the table: every read is a range of
-- jobs_queue_claim_idx (queue, priority, run_at, id), never a table scan or a
-- sort. The (queue, priority) pairs are found by a loose index scan, one
-- probe per pair; within a pair, ready rows are the range run_at <= now() and
-- scheduled rows the range run_at > now(). The ranges are written as row
-- comparisons on exactly the index's leading columns, so that the planner
-- cannot pick another index and filter (jobs_claim_idx would walk every
-- queue's rows). Measured on 1,000,000 rows: see the README.
--
-- `ready` leaves out jobs that tx-mode claims are running: rows deleted by a
-- transaction still in progress, i.e. whose xmax is the xid of a transaction
-- holding its transactionid lock (a claim that rolled back leaves an xmax
-- whose lock is gone: the row counts as ready again). Checking xmax needs the
-- heap, so it is done for the first $2 ready rows of the queue in claim order,
-- where claims take their rows; the count itself is index-only. Beyond that
-- window (a queue with more ready jobs than $2) a running job can only be
-- counted when more than $2 ready jobs were queued ahead of it since it was
-- claimed: the count is then high by at most the number of jobs in flight.
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
    dead_queues AS (
        (SELECT queue FROM pgwake.dead_jobs ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM pgwake.dead_jobs d
                WHERE d.queue > dq.queue ORDER BY d.queue LIMIT 1)
        FROM dead_queues dq
        WHERE dq.queue IS NOT NULL
    ),
    queues AS (
        SELECT queue FROM pairs
        UNION
        SELECT queue FROM dead_queues WHERE queue IS NOT NULL
    ),
    running AS MATERIALIZED (
        SELECT transactionid AS xid FROM pg_locks
        WHERE locktype = 'transactionid' AND granted
    )
SELECT q.queue,
       greatest(0, (
           SELECT count(*) FROM (
               SELECT FROM pairs p
               CROSS JOIN LATERAL (
                   SELECT FROM pgwake.jobs j
                   WHERE (j.queue, j.priority, j.run_at) >= (p.queue, p.priority, '-infinity')
                     AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
               ) r
               WHERE p.queue = q.queue
               LIMIT $1
           ) visible
       ) - (
           SELECT count(*) FROM (
               SELECT r.xmax FROM pairs p
               CROSS JOIN LATERAL (
                   SELECT j.xmax FROM pgwake.jobs j
                   WHERE (j.queue, j.priority, j.run_at) >= (p.queue, p.priority, '-infinity')
                     AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
                   ORDER BY j.queue, j.priority, j.run_at, j.id
                   LIMIT $2
               ) r
               WHERE p.queue = q.queue
               LIMIT $2
           ) head
           WHERE head.xmax IN (SELECT xid FROM running)
       )) AS ready,
       -- Waiting since the later of created_at and run_at (as the pickup
       -- latency counts it); each priority's first ready job is the one
       -- that has waited longest in it.
       coalesce(greatest(0,
           extract(epoch FROM now()) - extract(epoch FROM (
               SELECT min(o.ready_since) FROM pairs p
               CROSS JOIN LATERAL (
                   SELECT greatest(j.created_at, j.run_at) AS ready_since FROM pgwake.jobs j
                   WHERE (j.queue, j.priority, j.run_at) >= (p.queue, p.priority, '-infinity')
                     AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
                     AND j.xmax NOT IN (SELECT xid FROM running)
                   ORDER BY j.queue, j.priority, j.run_at, j.id
                   LIMIT 1
               ) o
               WHERE p.queue = q.queue
           ))), 0)::float8 AS oldest_ready_age,
       (SELECT count(*) FROM (
            SELECT FROM pairs p
            CROSS JOIN LATERAL (
                SELECT FROM pgwake.jobs j
                WHERE (j.queue, j.priority, j.run_at) > (p.queue, p.priority, now())
                  AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, 'infinity')
            ) s
            WHERE p.queue = q.queue
            LIMIT $1
        ) c) AS scheduled,
       (SELECT count(*) FROM (
            SELECT FROM pgwake.dead_jobs d WHERE d.queue = q.queue LIMIT $1
        ) c) AS dead
FROM queues q
ORDER BY q.queue
LIMIT 1000
