-- Queue gauges with bounded cost, however large the tables grow:
-- - distinct queues by a loose index scan (one index probe per queue);
-- - per queue and state, rows counted up to $1 (the depth cap) only;
-- - running tx-mode jobs are rows deleted by a transaction still in
--   progress: their xmax is the xid of a transaction that holds its
--   transactionid lock, so they are left out of `ready`; rows whose deleting
--   claim rolled back (xmax of an aborted transaction) count as ready again.
WITH RECURSIVE
    live_q AS (
        (SELECT queue FROM pgwake.jobs ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM pgwake.jobs j WHERE j.queue > live_q.queue ORDER BY j.queue LIMIT 1)
        FROM live_q WHERE live_q.queue IS NOT NULL
    ),
    dead_q AS (
        (SELECT queue FROM pgwake.dead_jobs ORDER BY queue LIMIT 1)
        UNION ALL
        SELECT (SELECT d.queue FROM pgwake.dead_jobs d WHERE d.queue > dead_q.queue ORDER BY d.queue LIMIT 1)
        FROM dead_q WHERE dead_q.queue IS NOT NULL
    ),
    queues AS (
        SELECT queue FROM live_q WHERE queue IS NOT NULL
        UNION
        SELECT queue FROM dead_q WHERE queue IS NOT NULL
    ),
    running AS (
        SELECT coalesce(array_agg(transactionid), '{}') AS xids
        FROM pg_locks WHERE locktype = 'transactionid' AND granted
    )
SELECT queues.queue,
       ready.n AS ready,
       coalesce(ready.oldest, 0)::float8 AS oldest_ready_age,
       scheduled.n AS scheduled,
       dead.n AS dead
FROM queues
CROSS JOIN running
CROSS JOIN LATERAL (
    SELECT count(*) AS n, extract(epoch FROM now() - min(run_at)) AS oldest
    FROM (SELECT j.run_at FROM pgwake.jobs j
          WHERE j.queue = queues.queue AND j.run_at <= now()
            AND NOT (j.xmax = ANY (running.xids))
          LIMIT $1) r
) ready
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (SELECT 1 FROM pgwake.jobs j
          WHERE j.queue = queues.queue AND j.run_at > now() LIMIT $1) s
) scheduled
CROSS JOIN LATERAL (
    SELECT count(*) AS n
    FROM (SELECT 1 FROM pgwake.dead_jobs d WHERE d.queue = queues.queue LIMIT $1) d
) dead
ORDER BY queues.queue
LIMIT 1000
