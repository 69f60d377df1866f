-- `pgwake queue list`, the paused gauge and `pgwake stats`: every queue that
-- has settings (pgwake.queues) or waiting jobs, with its settings (a queue
-- without a row has none). The queues of pgwake.jobs are found by a loose
-- scan of jobs_queue_claim_idx: one probe per distinct queue.
WITH RECURSIVE job_queues AS (
    (SELECT queue FROM pgwake.jobs ORDER BY queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM pgwake.jobs j WHERE j.queue > jq.queue ORDER BY j.queue LIMIT 1)
    FROM job_queues jq
    WHERE jq.queue IS NOT NULL
),
names AS (
    SELECT queue AS name FROM job_queues WHERE queue IS NOT NULL
    UNION
    SELECT name FROM pgwake.queues
)
SELECT n.name, coalesce(q.paused, false) AS paused, q.paused_at, q.max_running,
       q.rate_count, extract(epoch FROM q.rate_window)::float8 AS rate_window,
       q.limit_key_path, coalesce(q.fair_keys, false) AS fair_keys, q.max_running_per_key,
       (SELECT coalesce(jsonb_object_agg(k.limit_key, k.max_running), '{}')::text
        FROM pgwake.queue_key_limits k WHERE k.queue = n.name) AS key_max_running,
       q.key_rate_count, extract(epoch FROM q.key_rate_window)::float8 AS key_rate_window,
       coalesce(q.shed_under_pressure, false) AS shed_under_pressure, q.paused_by
FROM names n
LEFT JOIN pgwake.queues q ON q.name = n.name
ORDER BY n.name
