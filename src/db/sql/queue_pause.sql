-- `pgwake queue pause`: $1 the queue. True when it was not paused before
-- (functions/queues.sql).
SELECT pgwake.pause_queue($1::text)
