-- The scheduler's claim: due schedules, locked until this transaction ends.
-- A row another scheduler holds is skipped: that scheduler is serving it, and
-- if it dies its transaction rolls back and the row is due again at once.
-- Due is judged by the database's clock (now(), returned for the tick
-- arithmetic), never a worker's.
SELECT name, cron, tz, task, payload, queue, priority, catch_up, next_tick, fresh,
       last_job_id, now() AS now
FROM pgwake.schedules
WHERE next_tick <= now() AND error IS NULL AND enabled
ORDER BY next_tick
LIMIT $1
FOR UPDATE SKIP LOCKED
