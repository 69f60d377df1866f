-- How much work a queue has for workers now (functions/queue_pressure.sql):
-- $1 the queue (NULL: one row per queue), $2 the cap of the ready count.
SELECT queue, runnable, ready, running, oldest_ready_age, paused, capped
FROM pgwake.queue_pressure($1::text, $2::int4)
