-- pgwake schema, version 3: workers that are idle and waiting for a NOTIFY.
-- The insert trigger sends NOTIFY only when some live row here covers the
-- queue: every transaction that NOTIFYs takes a global lock at commit, so
-- while all workers are busy draining (they will see new jobs on their next
-- claim anyway) producers skip it and keep their full insert rate.
-- UNLOGGED: registrations are soft state; rows expire (expires_at) if a
-- worker dies without removing its own.
CREATE UNLOGGED TABLE pgwake.waiting_workers (
    worker_id  text        PRIMARY KEY,
    -- NULL: every queue
    queues     text[],
    expires_at timestamptz NOT NULL
);
