-- Seconds until the earliest tick not yet served (negative when one is
-- overdue; NULL without schedules): one lookup in schedules_due_idx.
SELECT extract(epoch FROM min(next_tick) - now())::float8
FROM pgwake.schedules
WHERE error IS NULL AND enabled
