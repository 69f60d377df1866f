-- `pgwake history`: finished jobs, newest first, filtered. $5: seconds back
-- from now (database clock), $6: a moment; NULL: no bound. $7, $8: the
-- previous page's last (finished_at, id); NULL: the first page.
SELECT id, queue, task, payload::text, outcome, result::text, error, attempts, enqueued_at,
       started_at, finished_at, worker
FROM pgwake.finished_jobs
WHERE ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR task = $2)
  AND ($3::text IS NULL OR outcome = $3)
  AND ($5::float8 IS NULL OR finished_at >= now() - make_interval(secs => $5))
  AND ($6::timestamptz IS NULL OR finished_at >= $6)
  AND ($7::timestamptz IS NULL OR (finished_at, id) < ($7, $8::int8))
ORDER BY finished_at DESC, id DESC
LIMIT $4
