-- `pgwake queue resume`: $1 the queue. True when it was paused before
-- (triggers/queues.sql).
SELECT pgwake.resume_queue($1::text)
