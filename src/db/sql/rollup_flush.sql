-- The rollup service's flush (src/services/rollup.rs): add one worker's
-- counts of the last seconds into pgwake.minute_stats, one row per minute
-- (epoch minutes), queue, task and outcome. Rows come sorted by key, so
-- workers flushing at once lock shared rows in one order (no deadlock).
INSERT INTO pgwake.minute_stats AS s
    (minute, queue, task, outcome, jobs, pickup_seconds_sum, pickup_seconds_max)
SELECT to_timestamp(m * 60), q, t, o, n, ps, pm
FROM unnest($1::int8[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::float8[], $7::float8[])
    AS u(m, q, t, o, n, ps, pm)
ON CONFLICT (minute, queue, task, outcome) DO UPDATE
SET jobs = s.jobs + excluded.jobs,
    pickup_seconds_sum = s.pickup_seconds_sum + excluded.pickup_seconds_sum,
    pickup_seconds_max = greatest(s.pickup_seconds_max, excluded.pickup_seconds_max)
