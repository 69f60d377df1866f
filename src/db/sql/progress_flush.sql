-- The latest progress of many running jobs, in one statement: the
-- worker's coalesced write (claim/run/progress.rs), every --progress-interval.
-- $1 job ids, $2 claim tokens (lease runs; NULL for tx runs), $3 claim
-- transactions as text (tx runs; NULL for lease runs), $4 values (JSON
-- text, bounded by the worker), $5 messages.
--
-- Fenced by the run (pgwake.progress_current, functions/jobs.sql): a run
-- whose lease was lost or whose claim transaction ended writes nothing,
-- and a row of another run is overwritten only when that run is over, so
-- a stale run can never replace a newer run's progress. Returns the ids
-- written.
WITH u AS (
    SELECT u.job_id, u.token, u.xid::xid8 AS xid, u.value::jsonb AS value, u.message
    FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[])
        AS u(job_id, token, xid, value, message)
)
INSERT INTO pgwake.job_progress AS p (job_id, token, xid, value, message, updated_at)
SELECT u.job_id, u.token, u.xid, u.value, u.message, now()
FROM u
WHERE pgwake.progress_current(u.job_id, u.token, u.xid)
ON CONFLICT (job_id) DO UPDATE
    SET token = excluded.token, xid = excluded.xid, value = excluded.value,
        message = excluded.message, updated_at = excluded.updated_at
    WHERE (p.token IS NOT DISTINCT FROM excluded.token AND p.xid IS NOT DISTINCT FROM excluded.xid)
       OR NOT pgwake.progress_current(p.job_id, p.token, p.xid)
RETURNING job_id
