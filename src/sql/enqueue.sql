-- Enqueue jobs in one statement, however many (bulk and single alike).
-- NULL columns take the table's defaults. Returns the new ids in input order.
INSERT INTO pgwake.jobs (task, payload, queue, run_at, priority, max_attempts)
SELECT task, coalesce(payload, '{}'::jsonb), coalesce(queue, 'default'),
       coalesce(run_at, now()), coalesce(priority, 0), coalesce(max_attempts, 25)
FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::text[], $5::int[], $6::int[])
    WITH ORDINALITY AS j(task, payload, queue, run_at_text, priority, max_attempts, n)
CROSS JOIN LATERAL (SELECT j.run_at_text::timestamptz AS run_at) t
ORDER BY n
RETURNING id
