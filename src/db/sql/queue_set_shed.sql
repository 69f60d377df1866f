-- `pgwake queue set Q --shed-under-pressure on|off`: $1 the queue, $2 on or
-- off. See functions/queues.sql.
SELECT pgwake.set_queue_shed_under_pressure($1::text, $2::bool)
