-- tx mode, history on: record the batch's done jobs in the claim
-- transaction, so they commit (or roll back) with the jobs' removal.
-- `started_at` is when the run was claimed (this transaction's start).
-- $1 ids … $7 results (JSON text or NULL), $8 the worker's id, $9 ordering
-- keys, $10 unique keys.
INSERT INTO pgwake.finished_jobs
    (id, queue, task, payload, outcome, result, attempts, enqueued_at, started_at, finished_at,
     worker, ordering_key, unique_key, limit_key)
SELECT id, queue, task, payload::jsonb, 'done', result::jsonb, attempts, created_at, now(),
       clock_timestamp(), $8, ordering_key, unique_key, limit_key
FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::text[], $9::text[], $10::text[], $11::text[])
    AS j(id, queue, task, payload, attempts, created_at, result, ordering_key, unique_key,
         limit_key)
