-- The paused queues (migration 0009), for the pgwake_queue_paused gauge and
-- `pgwake stats`. A primary-key-sized table: one sequential scan.
SELECT name FROM pgwake.queues WHERE paused ORDER BY name
