-- Bench, steady state: one job of task $2 on queue $1 per intended start
-- time in $3 (Unix epoch seconds). The handler measures how late it started
-- against payload.t, so a producer that falls behind cannot hide latency.
INSERT INTO pgwake.jobs (queue, task, payload)
SELECT $1, $2, jsonb_build_object('t', t)
FROM unnest($3::float8[]) AS t
