-- The worker registry's readers (migration 0016: pgwake.workers).

-- Workers alive now: renewed within their time to live (30 s). (Columns
-- are only ever added at the end: CREATE OR REPLACE VIEW keeps the others.)
CREATE OR REPLACE VIEW pgwake.live_workers AS
SELECT id, host, pid, version, application_name, queues, tasks, handlers,
       concurrency, running, started_at, seen_at, processes
FROM pgwake.workers
WHERE expires_at > now();

-- Ready jobs that no live worker can run: no live worker works their queue
-- with a handler for their task (or a catch-all). Counted among the first
-- `head` ready jobs of each queue and priority, in claim order, over the
-- first `pairs_max` (queue, priority) pairs: jobs nobody claims stay at the
-- head of their queue, so this finds them at a bounded cost (a loose index
-- scan of jobs_queue_claim_idx and at most head × pairs_max rows), and the
-- count is a lower bound when a head is full. `jobs`: how many; `oldest`:
-- when the longest-waiting of them became ready.
CREATE OR REPLACE FUNCTION pgwake.unserved_jobs(head integer DEFAULT 100, pairs_max integer DEFAULT 2000)
RETURNS TABLE (queue text, task text, jobs bigint, oldest timestamptz)
LANGUAGE sql STABLE AS $$
    WITH RECURSIVE pairs AS (
        (SELECT j.queue, j.priority FROM pgwake.jobs j ORDER BY j.queue, j.priority LIMIT 1)
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
    heads AS (
        SELECT h.queue, h.task, h.run_at
        FROM (SELECT * FROM pairs LIMIT pairs_max) p
        CROSS JOIN LATERAL (
            SELECT j.queue, j.task, j.run_at FROM pgwake.jobs j
            WHERE (j.queue, j.priority) = (p.queue, p.priority) AND j.run_at <= now()
            ORDER BY j.queue, j.priority, j.run_at, j.id
            LIMIT head
        ) h
    )
    SELECT h.queue, h.task, count(*), min(h.run_at)
    FROM heads h
    WHERE NOT EXISTS (
        SELECT 1 FROM pgwake.workers w
        WHERE w.expires_at > now()
          AND (w.queues IS NULL OR h.queue = ANY(w.queues))
          AND ('*' = ANY(w.tasks) OR h.task = ANY(w.tasks)))
    GROUP BY h.queue, h.task
    ORDER BY h.queue, h.task
$$;
