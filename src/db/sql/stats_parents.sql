-- `pgwake stats`: per queue, the waiting jobs held for their parents
-- (migration 0039, functions/flows.sql). Walks the open edges
-- (job_parents_child_idx), each child looked up by id: no scan of the queue.
SELECT j.queue, count(*)::int8
FROM pgwake.jobs j
WHERE j.id IN (SELECT e.child FROM pgwake.job_parents e WHERE e.state <> 'done')
  AND j.parents_open > 0
GROUP BY j.queue
