-- Schedules by state, for the pgwake_schedules gauge (active: served,
-- enabled and valid; a disabled one counts in neither).
SELECT count(*) FILTER (WHERE error IS NULL AND enabled),
       count(*) FILTER (WHERE error IS NOT NULL)
FROM pgwake.schedules
