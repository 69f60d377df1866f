-- One page of the live workers (pgwake.live_workers' rule: not expired),
-- by id: $1 rows from row $2. The walk of the primary key stops after the
-- page, so a page reads its rows and those before it, never the whole
-- registry (issue 33, item 7). With each its persistent handler processes
-- (migration 0029). The console asks for one row more than it
-- shows, to know whether there is a next page.
SELECT id, host, pid, version, application_name, queues, tasks, handlers::text,
       concurrency, running, started_at, seen_at, true AS live, processes::text
FROM pgwake.workers
WHERE expires_at > now()
ORDER BY id
LIMIT $1 OFFSET $2
