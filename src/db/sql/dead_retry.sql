-- Move dead jobs back into the queue with their attempts reset, ready now.
-- $1: ids (NULL: every dead job), $2: queue (NULL: any), $3: cancelled
-- jobs too (false: a job an operator cancelled on purpose stays cancelled).
WITH revived AS (
    DELETE FROM pgwake.dead_jobs
    WHERE ($1::bigint[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR queue = $2)
      AND ($3::bool OR last_error IS DISTINCT FROM 'cancelled')
    RETURNING *
),
-- A revived job starts afresh: a cancel request left from its last run
-- (pgwake.cancel_requests) must not cancel it again.
forgotten AS (
    DELETE FROM pgwake.cancel_requests WHERE job_id IN (SELECT id FROM revived)
)
INSERT INTO pgwake.jobs
    (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at,
     timeout, ordering_key, unique_key, ordering_at, limit_key, has_children)
SELECT id, queue, task, payload, priority, now(), 0, max_attempts, last_error, created_at,
       timeout, ordering_key,
       -- a job enqueued with this unique key meanwhile keeps the key, even
       -- one a producer has not committed yet: never waits (functions/keys.sql)
       pgwake.requeued_unique_key(unique_key),
       -- back in its place in its ordering key
       coalesce(ordering_at, run_at), limit_key,
       -- a parent: what its failure did to its children is undone
       -- (functions/flows.sql); false at once for a job that never had any
       EXISTS (SELECT 1 FROM pgwake.job_parents e WHERE e.parent = revived.id)
           AND pgwake.revive_parent(id)
FROM revived
RETURNING id
