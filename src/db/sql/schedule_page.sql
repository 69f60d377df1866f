-- One page of the schedules by name, as schedule_list.sql shows them: $1
-- rows from row $2. The walk of the primary key stops after the page, so a
-- page reads its rows and those before it, never every schedule (issue 33,
-- item 7).
SELECT name, cron, tz, task, payload, queue, priority,
       CASE catch_up WHEN 0 THEN 'skip' ELSE catch_up::text END AS catch_up,
       CASE WHEN fresh OR error IS NOT NULL THEN NULL ELSE next_tick END AS next_tick,
       last_tick, last_job_id, ticks_enqueued, ticks_missed, ticks_waiting, error, enabled
FROM pgwake.schedules
ORDER BY name
LIMIT $1 OFFSET $2
