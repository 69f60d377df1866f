-- Enqueue jobs in one statement, however many (bulk and single alike).
-- NULL columns take the table's defaults. Returns (id, duplicate) in input
-- order. $7: delays in seconds, applied to the database's now() (never the
-- client's clock) when run_at is NULL; $8: per-job timeouts in seconds
-- (NULL: the worker's --job-timeout); $9 ordering keys; $10 unique keys;
-- $11 unique_running (a running job of the key counts as a duplicate);
-- $12 limit keys (NULL: the queue's limit_key_path, migration 0020);
-- $13, $14: trace contexts (traceparent, tracestate; NULL: none given);
-- $15: each job's parents as a JSON array of ids (NULL: none), $16 its
-- on_parent_failure (functions/flows.sql); $17: each job's batch (NULL:
-- none; pgwake.batch_add).
-- Jobs without a unique key are one INSERT; jobs with one go through
-- pgwake.enqueue_unique (functions/keys.sql), which returns the waiting
-- job's id for a duplicate.
WITH j AS (
    SELECT j.*, coalesce(t.run_at, now() + make_interval(secs => j.delay_secs), now()) AS at
    FROM unnest($1::text[], $2::jsonb[], $3::text[], $4::text[], $5::int[], $6::int[],
                $7::float8[], $8::float8[], $9::text[], $10::text[], $11::boolean[], $12::text[],
                $13::text[], $14::text[], $15::jsonb[], $16::text[], $17::int8[])
        WITH ORDINALITY AS j(task, payload, queue, run_at_text, priority, max_attempts, delay_secs,
                             timeout_secs, ordering_key, unique_key, unique_running, limit_key,
                             traceparent, tracestate, after, on_parent_failure, batch, n)
    CROSS JOIN LATERAL (SELECT j.run_at_text::timestamptz AS run_at) t
),
plain AS (
    INSERT INTO pgwake.jobs (task, payload, queue, run_at, priority, max_attempts, timeout,
                             ordering_key, limit_key)
    SELECT task, coalesce(payload, '{}'::jsonb), coalesce(queue, 'default'), at,
           coalesce(priority, 0), coalesce(max_attempts, 25),
           make_interval(secs => timeout_secs), ordering_key, limit_key
    FROM j WHERE unique_key IS NULL
    ORDER BY n
    RETURNING id
),
-- Ids are drawn in insertion order, so the k-th smallest new id is the
-- k-th job without a unique key.
plain_ids AS (SELECT id, row_number() OVER (ORDER BY id) AS k FROM plain),
plain_rows AS (SELECT n, row_number() OVER (ORDER BY n) AS k FROM j WHERE unique_key IS NULL),
keyed AS (
    SELECT j.n, e.id, e.duplicate
    FROM j CROSS JOIN LATERAL pgwake.enqueue_unique(
        j.task, j.payload, j.queue, j.at, j.priority, j.max_attempts,
        make_interval(secs => j.timeout_secs), j.ordering_key, j.unique_key,
        coalesce(j.unique_running, false), j.limit_key) e
    WHERE j.unique_key IS NOT NULL
)
-- Third column: whether the job's trace context was recorded
-- (pgwake.trace_job, functions/traces.sql: a malformed one is counted and
-- ignored); NULL when none was given or for a duplicate, which keeps the
-- waiting job's. Evaluated per returned row, before the statement's
-- AFTER triggers: a context given here wins over the transaction's
-- `SET LOCAL pgwake.traceparent` (jobs_trace_context keeps the first).
SELECT x.id, x.duplicate,
       CASE WHEN NOT x.duplicate AND j.traceparent IS NOT NULL
            THEN pgwake.trace_job(x.id, j.traceparent, j.tracestate) END,
       -- Parents: added per returned row (a VOLATILE call sees the rows
       -- this statement inserted); none for a duplicate.
       CASE WHEN NOT x.duplicate AND j.after IS NOT NULL
            THEN pgwake.add_parents(x.id, ARRAY(SELECT jsonb_array_elements_text(j.after)::bigint),
                                    j.on_parent_failure) END,
       -- The batch, after the parents: a job both waits and is waited for.
       CASE WHEN NOT x.duplicate AND j.batch IS NOT NULL
            THEN pgwake.batch_add(x.id, j.batch) END
FROM (
    SELECT r.n, p.id, false AS duplicate FROM plain_rows r JOIN plain_ids p USING (k)
    UNION ALL
    SELECT n, id, duplicate FROM keyed
) x
JOIN j USING (n)
ORDER BY x.n
