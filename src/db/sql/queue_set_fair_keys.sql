-- `pgwake queue set Q --fair-keys | --no-fair-keys`: $1 the queue, $2 on or
-- off. See functions/queues.sql.
SELECT pgwake.set_queue_fair_keys($1::text, $2::bool)
