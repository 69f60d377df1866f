-- SQL producer API: SELECT pgwake.enqueue('send_email', '{"to": "a@b.c"}');
-- Returns the new job's id. Every argument but the task has a default;
-- `timeout` (NULL: the worker's --job-timeout) bounds each run of this job.
CREATE OR REPLACE FUNCTION pgwake.enqueue(
    task         text,
    payload      jsonb       DEFAULT '{}'::jsonb,
    queue        text        DEFAULT 'default',
    run_at       timestamptz DEFAULT now(),
    priority     integer     DEFAULT 0,
    max_attempts integer     DEFAULT 25,
    timeout      interval    DEFAULT NULL
) RETURNS bigint
LANGUAGE sql AS $$
    INSERT INTO pgwake.jobs (task, payload, queue, run_at, priority, max_attempts, timeout)
    VALUES (task, coalesce(payload, '{}'::jsonb), coalesce(queue, 'default'),
            coalesce(run_at, now()), coalesce(priority, 0), coalesce(max_attempts, 25),
            timeout)
    RETURNING id
$$;
