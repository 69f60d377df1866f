-- Enqueue jobs in one statement, however many (bulk and single alike).
-- NULL columns take the table's defaults. Returns the new ids in input order.
-- $7: delays in seconds, applied to the database's now() (never the client's
-- clock) when run_at is NULL; $8: per-job timeouts in seconds (NULL: the
-- worker's --job-timeout).
INSERT INTO pgwake.jobs (task, payload, queue, run_at, priority, max_attempts, timeout)
SELECT task, coalesce(payload, '{}'::jsonb), coalesce(queue, 'default'),
       coalesce(run_at, now() + make_interval(secs => delay_secs), now()),
       coalesce(priority, 0), coalesce(max_attempts, 25),
       make_interval(secs => timeout_secs)
FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::text[], $5::int[], $6::int[], $7::float8[],
            $8::float8[])
    WITH ORDINALITY AS j(task, payload, queue, run_at_text, priority, max_attempts, delay_secs,
                         timeout_secs, n)
CROSS JOIN LATERAL (SELECT j.run_at_text::timestamptz AS run_at) t
ORDER BY n
RETURNING id
