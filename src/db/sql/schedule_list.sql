-- Every schedule with its counters, by name (as the pgwake.schedule_list
-- view shows them; read from the table, which the worker role may read).
SELECT name, cron, tz, task, payload, queue, priority,
       CASE catch_up WHEN 0 THEN 'skip' ELSE catch_up::text END AS catch_up,
       CASE WHEN fresh OR error IS NOT NULL THEN NULL ELSE next_tick END AS next_tick,
       last_tick, last_job_id, ticks_enqueued, ticks_missed, ticks_waiting, error, enabled
FROM pgwake.schedules
ORDER BY name
