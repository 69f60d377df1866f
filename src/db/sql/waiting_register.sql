-- This worker is idle and LISTENing for the queues $2 (NULL: all) until $3
-- seconds from now, unless it renews.
INSERT INTO pgwake.waiting_workers (worker_id, queues, expires_at)
VALUES ($1, $2, now() + make_interval(secs => $3))
ON CONFLICT (worker_id) DO UPDATE SET queues = excluded.queues, expires_at = excluded.expires_at
