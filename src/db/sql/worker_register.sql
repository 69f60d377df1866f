-- This worker is alive until $11 seconds from now, unless it renews: its
-- identity, what it serves, how many jobs it runs (pgwake.workers,
-- migration 0016) and its persistent handler processes ($12, migration
-- 0029). Also forgets workers expired for over an hour (their processes
-- died without removing their rows).
WITH forget AS (
    DELETE FROM pgwake.workers WHERE expires_at < now() - interval '1 hour'
)
INSERT INTO pgwake.workers AS w (id, host, pid, version, application_name, queues, tasks,
                                 handlers, concurrency, running, expires_at, processes)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8::text::jsonb, $9, $10, now() + make_interval(secs => $11),
        $12::text::jsonb)
ON CONFLICT (id) DO UPDATE SET running = excluded.running, processes = excluded.processes,
                               seen_at = now(), expires_at = excluded.expires_at
