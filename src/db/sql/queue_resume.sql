-- `pgwake queue resume`: $1 the queue. True when it was paused before
-- (functions/queues.sql).
SELECT pgwake.resume_queue($1::text)
