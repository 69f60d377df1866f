-- The worker registry (migration 0016): live workers (pgwake.live_workers),
-- then those whose row expired without being removed (killed, host lost)
-- within the hour before a live worker deletes it, newest first. With each
-- its persistent handler processes (migration 0029).
SELECT * FROM (
    SELECT id, host, pid, version, application_name, queues, tasks, handlers::text,
           concurrency, running, started_at, seen_at, true AS live, processes::text
    FROM pgwake.live_workers
    UNION ALL
    SELECT id, host, pid, version, application_name, queues, tasks, handlers::text,
           concurrency, running, started_at, seen_at, false, processes::text
    FROM pgwake.workers
    WHERE expires_at <= now()
) w
ORDER BY live DESC, seen_at DESC
LIMIT 1000
