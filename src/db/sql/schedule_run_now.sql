-- Enqueue one job of schedule $1 now, as its next tick would (its task,
-- payload, queue and priority); its ticks and counters are unchanged.
INSERT INTO pgwake.jobs (task, payload, queue, priority)
SELECT task, payload, queue, priority FROM pgwake.schedules WHERE name = $1
RETURNING id
