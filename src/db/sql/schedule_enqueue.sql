-- Enqueue the due ticks of a batch of schedules, one job per tick,
-- run_at = the tick. Returns the new ids in input order.
INSERT INTO pgwake.jobs (task, payload, queue, priority, run_at)
SELECT task, payload, queue, priority, tick
FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::int[], $5::timestamptz[])
    WITH ORDINALITY AS t(task, payload, queue, priority, tick, n)
ORDER BY n
RETURNING id
