-- `pgwake queue set Q --max-running-per-key N | --no-max-running-per-key`:
-- $1 the queue, $2 the limit per limit key (NULL: none). See
-- functions/queues.sql.
SELECT pgwake.set_queue_max_running_per_key($1::text, $2::int)
