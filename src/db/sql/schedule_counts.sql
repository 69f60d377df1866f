-- Schedules by state, for the pgwake_schedules gauge.
SELECT count(*) FILTER (WHERE error IS NULL),
       count(*) FILTER (WHERE error IS NOT NULL)
FROM pgwake.schedules
