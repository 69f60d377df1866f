-- The queues with a setting (migration 0009): paused ones, for the
-- pgwake_queue_paused gauge and `pgwake stats`, and limited ones with their
-- max_running, for the pgwake_queue_max_running gauge. A primary-key-sized
-- table: one sequential scan.
SELECT name, paused, max_running FROM pgwake.queues
WHERE paused OR max_running IS NOT NULL
ORDER BY name
