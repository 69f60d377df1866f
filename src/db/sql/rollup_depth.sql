-- The sampler's depth per queue for the current minute (the minute's last
-- sample wins): one statement per sample, whatever the number of queues.
INSERT INTO pgwake.minute_depth AS d (minute, queue, ready, scheduled)
SELECT date_trunc('minute', now()), q, r, s
FROM unnest($1::text[], $2::int8[], $3::int8[]) AS u(q, r, s)
ORDER BY q
ON CONFLICT (minute, queue) DO UPDATE
SET ready = excluded.ready, scheduled = excluded.scheduled
