-- The rollup service's retention: forget minutes older than $1 seconds
-- (a few thousand rows at a time at most: it runs every few minutes).
WITH s AS (DELETE FROM pgwake.minute_stats WHERE minute < now() - make_interval(secs => $1) RETURNING 1),
     d AS (DELETE FROM pgwake.minute_depth WHERE minute < now() - make_interval(secs => $1) RETURNING 1)
SELECT (SELECT count(*) FROM s)::int8, (SELECT count(*) FROM d)::int8
