-- The governor's reading (functions/pressure.sql): the level with
-- hysteresis, since when, whether this call changed it (and so recorded the
-- change and shed or resumed queues), the causes, and the level before.
SELECT level, since, changed, causes, previous FROM pgwake.pressure()
