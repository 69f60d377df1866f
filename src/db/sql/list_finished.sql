-- The finished jobs (history) of `pgwake.list_jobs(state => 'finished')`
-- (functions/jobs.sql), same columns and filters, as a plain statement:
-- planned with its values, it reads the id index of each daily partition in
-- order (a merge) and stops after the page, where the function's UNION ALL
-- over the partitioned table sorts every history row (1.5 s at 10,000,000
-- rows). $1: ids above, $2 queue, $3 task, $4 unique key, $5 payload
-- containment (JSON text), $6 page size (1 to 1000), $7 finished at or
-- after (NULL: any).
SELECT f.id, f.outcome, f.queue, f.task, NULL::int4, f.attempts, NULL::int4, NULL::timestamptz,
       f.enqueued_at, NULL::text, f.unique_key, f.worker, f.error, f.limit_key
FROM pgwake.finished_jobs f
WHERE f.id > $1
  AND ($2::text IS NULL OR f.queue = $2)
  AND ($3::text IS NULL OR f.task = $3)
  AND ($4::text IS NULL OR f.unique_key = $4)
  AND ($5::text IS NULL OR f.payload @> $5::text::jsonb)
  AND ($7::timestamptz IS NULL OR f.finished_at >= $7)
ORDER BY f.id
LIMIT least(greatest($6::int4, 1), 1000)
