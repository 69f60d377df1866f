-- Lease-mode jobs done, history on: remove their leases fenced by claim
-- token ($1) and record them with their results ($2, JSON text or NULL) in
-- the same statement, and keep the results of those with children on their
-- edges to the children that wait (migration 0043). A fenced-out token
-- records nothing. Returns the tokens that matched.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS u(token, result)
),
done AS (
    DELETE FROM pgwake.leased_jobs l USING u WHERE l.token = u.token
    RETURNING l.*, u.result
),
recorded AS (
    INSERT INTO pgwake.finished_jobs
        (id, queue, task, payload, outcome, result, attempts, enqueued_at, started_at,
         finished_at, worker, ordering_key, unique_key, limit_key)
    SELECT id, queue, task, payload, 'done', result::jsonb, attempts, created_at, leased_at,
           clock_timestamp(), worker_id, ordering_key, unique_key, limit_key
    FROM done
),
kept AS (
    UPDATE pgwake.job_parents e SET result = d.result::jsonb
    FROM done d
    WHERE d.has_children AND d.result IS NOT NULL AND e.parent = d.id AND e.state = 'open'
)
SELECT token FROM done
