-- `pgwake queue set Q --max-running N | --no-max-running`: $1 the queue,
-- $2 the limit (NULL: none). See functions/queues.sql.
SELECT pgwake.set_queue_max_running($1::text, $2::int)
