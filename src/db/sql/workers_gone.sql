-- Workers whose row expired without being removed (killed, host lost),
-- newest first, at most $1: the rows of the last hour at most, since a
-- live worker deletes older ones (functions/workers.sql).
SELECT id, host, pid, version, application_name, queues, tasks, handlers::text,
       concurrency, running, started_at, seen_at, false AS live, processes::text
FROM pgwake.workers
WHERE expires_at <= now()
ORDER BY seen_at DESC, id
LIMIT $1
