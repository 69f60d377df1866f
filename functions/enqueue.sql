-- SQL producer API: SELECT pgwake.enqueue('send_email', '{"to": "a@b.c"}');
-- Returns the new job's id. Every argument but the task has a default;
-- `timeout` (NULL: the worker's --job-timeout) bounds each run of this job.
-- `ordering_key`: jobs of one key run one at a time, in order;
-- `unique_key`: at most one waiting job per key; for a duplicate this
-- returns the waiting job's id and raises a NOTICE saying so
-- (pgwake.enqueue_unique returns (id, duplicate) instead);
-- `unique_running`: a running job of the key counts too.
-- `limit_key`: who the job is for, for the queue's per-key settings (NULL:
-- the queue's `limit_key_path` field of the payload, if it has one).
CREATE OR REPLACE FUNCTION pgwake.enqueue(
    task         text,
    payload      jsonb       DEFAULT '{}'::jsonb,
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 25,
    timeout      interval    DEFAULT NULL,
    ordering_key text        DEFAULT NULL,
    unique_key   text        DEFAULT NULL,
    unique_running boolean   DEFAULT false,
    limit_key    text        DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r record;
BEGIN
    IF enqueue.unique_key IS NULL THEN
        INSERT INTO pgwake.jobs (task, payload, queue, run_at, priority, max_attempts, timeout,
                                 ordering_key, limit_key)
        VALUES (enqueue.task, coalesce(enqueue.payload, '{}'::jsonb),
                coalesce(enqueue.queue, 'default'), coalesce(enqueue.run_at, now()),
                coalesce(enqueue.priority, 0), coalesce(enqueue.max_attempts, 25),
                enqueue.timeout, enqueue.ordering_key, enqueue.limit_key)
        RETURNING id INTO r;
        RETURN r.id;
    END IF;
    SELECT * INTO r FROM pgwake.enqueue_unique(enqueue.task, enqueue.payload, enqueue.queue,
        enqueue.run_at, enqueue.priority, enqueue.max_attempts, enqueue.timeout,
        enqueue.ordering_key, enqueue.unique_key, enqueue.unique_running, enqueue.limit_key);
    IF r.duplicate THEN
        RAISE NOTICE 'pgwake.enqueue: duplicate: job % already waits (or runs) with unique_key %',
            r.id, enqueue.unique_key;
    END IF;
    RETURN r.id;
END
$$;
