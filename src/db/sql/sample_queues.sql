-- Queue gauges per queue: ready and scheduled depth, dead jobs, and the age
-- of the oldest ready job. $1: the depth cap (each count stops there);
-- $2: the running-claim window (see `ready` below).
--
-- The cost is bounded by the cap and linear in the number of queues: every
-- read is a range of jobs_queue_claim_idx (queue, priority, run_at, id),
-- never a table scan or a sort. The (queue, priority) pairs are found by a
-- loose index scan, one probe per pair; each pair's counts are index ranges
-- (ready: run_at <= now(), scheduled: run_at > now()), computed once per
-- pair and summed per queue (an earlier version re-scanned the list of pairs
-- for every queue: quadratic, 1.2 s at 4,000 queues). Each pair's probe
-- returns the pair's first row this statement sees, and the pair's ranges
-- start there, not at the pair's first index entry: a held vacuum horizon
-- leaves the entries of every job claimed since at the head of the range,
-- and each read from the head walked them all (a heap visit each, since
-- none is dead to every snapshot): four walks a pair, 100-180 ms of a core
-- every 30 s after three pinned minutes at 1,500 jobs/s, each a stall the
-- producers' inserts queued behind; now the probe's one. The ranges are written
-- as row comparisons on exactly the index's leading columns, so that the
-- planner cannot pick another index and filter. The caller runs this under a
-- statement_timeout (the sampler's time limit). Measured: see docs/src/metrics.md.
--
-- `ready` leaves out jobs that tx-mode claims are running: rows deleted by a
-- transaction still in progress, i.e. whose xmax is the xid of a transaction
-- holding its transactionid lock (a claim that rolled back leaves an xmax
-- whose lock is gone: the row counts as ready again). Checking xmax needs the
-- heap, so it is done for the first $2 ready rows of each (queue, priority)
-- in claim order, where claims take their rows; the count itself is
-- index-only. Beyond that window a running job can only be counted when more
-- than $2 ready jobs were queued ahead of it since it was claimed: the count
-- is then high by at most the number of jobs in flight.
WITH RECURSIVE
    pairs AS (
        (SELECT queue, priority, run_at, id FROM pgwake.jobs
         ORDER BY queue, priority, run_at, id LIMIT 1)
        UNION ALL
        SELECT nxt.queue, nxt.priority, nxt.run_at, nxt.id
        FROM pairs p
        CROSS JOIN LATERAL (
            SELECT j.queue, j.priority, j.run_at, j.id FROM pgwake.jobs j
            WHERE (j.queue, j.priority) > (p.queue, p.priority)
            ORDER BY j.queue, j.priority, j.run_at, j.id
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
    running AS MATERIALIZED (
        SELECT transactionid AS xid FROM pg_locks
        WHERE locktype = 'transactionid' AND granted
    ),
    per_pair AS (
        SELECT p.queue,
               (SELECT count(*) FROM (
                    SELECT FROM pgwake.jobs j
                    WHERE (j.queue, j.priority, j.run_at, j.id) >= (p.queue, p.priority, p.run_at, p.id)
                      AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
                    LIMIT $1
                ) c) AS visible,
               (SELECT count(*) FROM (
                    SELECT j.xmax FROM pgwake.jobs j
                    WHERE (j.queue, j.priority, j.run_at, j.id) >= (p.queue, p.priority, p.run_at, p.id)
                      AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
                    ORDER BY j.queue, j.priority, j.run_at, j.id
                    LIMIT $2
                ) head
                WHERE head.xmax IN (SELECT xid FROM running)) AS running,
               -- Waiting since the later of created_at and run_at (as the
               -- pickup latency counts it); each priority's first ready job
               -- is the one that has waited longest in it.
               (SELECT greatest(j.created_at, j.run_at) FROM pgwake.jobs j
                WHERE (j.queue, j.priority, j.run_at, j.id) >= (p.queue, p.priority, p.run_at, p.id)
                  AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, now())
                  AND j.xmax NOT IN (SELECT xid FROM running)
                ORDER BY j.queue, j.priority, j.run_at, j.id
                LIMIT 1) AS ready_since,
               (SELECT count(*) FROM (
                    SELECT FROM pgwake.jobs j
                    WHERE (j.queue, j.priority, j.run_at) > (p.queue, p.priority, now())
                      AND (j.queue, j.priority, j.run_at) <= (p.queue, p.priority, 'infinity')
                    LIMIT $1
                ) c) AS scheduled
        FROM pairs p
    ),
    per_queue AS (
        SELECT queue,
               sum(visible) AS visible,
               sum(running) AS running,
               min(ready_since) AS ready_since,
               sum(scheduled) AS scheduled
        FROM per_pair
        GROUP BY queue
    ),
    queues AS (
        SELECT queue FROM per_queue
        UNION
        SELECT queue FROM dead_queues WHERE queue IS NOT NULL
    )
SELECT q.queue,
       greatest(0, least($1, coalesce(a.visible, 0)) - coalesce(a.running, 0))::bigint AS ready,
       coalesce(greatest(0,
           extract(epoch FROM now()) - extract(epoch FROM a.ready_since)), 0)::float8
           AS oldest_ready_age,
       least($1, coalesce(a.scheduled, 0))::bigint AS scheduled,
       (SELECT count(*) FROM (
            SELECT FROM pgwake.dead_jobs d WHERE d.queue = q.queue LIMIT $1
        ) c) AS dead
FROM queues q
LEFT JOIN per_queue a ON a.queue = q.queue
ORDER BY q.queue
