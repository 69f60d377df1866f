-- pgwake schema, version 16: the worker registry. Every `pgwake run` process
-- (and every embedded `Worker::run`) keeps one row here, renewed every 10 s
-- and removed when it stops; a process that died without removing it
-- (kill -9, a lost host) drops out of `pgwake.live_workers` once `expires_at`
-- passes (30 s after its last renewal) and its row is deleted an hour later
-- by any live worker. Read by `pgwake stats`, the console, and
-- `pgwake.unserved_jobs()` (jobs that no live worker can run).
CREATE TABLE pgwake.workers (
    id text PRIMARY KEY,
    host text NOT NULL,
    pid integer NOT NULL,
    version text NOT NULL,
    application_name text NOT NULL,
    -- The queues it works; NULL: every queue.
    queues text[],
    -- Tasks it has a handler for; '*': every task (a catch-all).
    tasks text[] NOT NULL,
    -- One object per task: {"task": …, "mode": "tx"|"lease"}.
    handlers jsonb NOT NULL DEFAULT '[]',
    concurrency integer NOT NULL,
    running integer NOT NULL DEFAULT 0,
    started_at timestamptz NOT NULL DEFAULT now(),
    seen_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
