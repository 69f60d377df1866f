-- Fair claims over every queue (src/fair.rs): the queues that have a ready
-- job, but those in $1 and paused ones, at most $2.
-- The distinct queues come from a loose scan of jobs_queue_claim_idx (one
-- probe per distinct queue, however deep each queue is); each is kept if a
-- job of it is ready (an index range of the same index, stopping at the
-- first ready row of its first priority that has one).
WITH RECURSIVE qs AS (
    (SELECT queue FROM pgwake.jobs ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgwake.jobs j WHERE j.queue > qs.queue ORDER BY j.queue LIMIT 1)
    FROM qs
    WHERE qs.queue IS NOT NULL
)
SELECT qs.queue
FROM qs
WHERE qs.queue IS NOT NULL
  AND qs.queue <> ALL($1::text[])
  AND qs.queue <> ALL(ARRAY(SELECT name FROM pgwake.queues WHERE paused))
  AND EXISTS (SELECT FROM pgwake.jobs j WHERE j.queue = qs.queue AND j.run_at <= now())
LIMIT $2
