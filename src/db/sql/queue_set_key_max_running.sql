-- `pgwake queue set Q --key K --max-running N | --no-max-running`: $1 the
-- queue, $2 the limit key, $3 its own limit (NULL: the queue's per-key
-- limit again). See functions/queues.sql.
SELECT pgwake.set_queue_key_max_running($1::text, $2::text, $3::int)
