-- pgwake schema, version 38: a job's W3C trace context (issue 39, item 1).
--
-- * `pgwake.job_traces`: the producer's `traceparent` and `tracestate` of a
--   job, by job id. Beside the job rather than on it: a job keeps its id
--   through every move (retries in both modes, the prefetch buffer, dead,
--   `pgwake dead retry`, history), so its context is kept without any claim,
--   requeue or bury statement carrying two more columns, and a claim of an
--   untraced job costs nothing more. Written only with a valid context:
--   pgwake.trace_job (functions/traces.sql) checks it, and counts and warns
--   about a malformed one instead of failing the insert.
-- * Rows of finished jobs are deleted by pgwake.sweep_job_traces (history
--   maintenance, every worker) once the job is in no table: not waiting,
--   running, dead, nor in the history.
-- * `pgwake.trace_context_rejected`: how many malformed contexts were
--   ignored. A sequence, not a row: nextval is never rolled back (a
--   rejected context counts even if the producer's transaction rolls back)
--   and concurrent producers do not queue on one row's lock.
CREATE TABLE IF NOT EXISTS pgwake.job_traces (
    job_id      bigint      PRIMARY KEY,
    -- version 00 (the only one defined): exactly 55 characters
    traceparent text        NOT NULL CONSTRAINT job_traces_traceparent_length
                                CHECK (octet_length(traceparent) = 55),
    -- at most 512 bytes: what the W3C specification asks a platform to keep
    tracestate  text        CONSTRAINT job_traces_tracestate_length
                                CHECK (octet_length(tracestate) <= 512),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE SEQUENCE IF NOT EXISTS pgwake.trace_context_rejected;

-- pgwake.enqueue gains `traceparent` and `tracestate` (functions/enqueue.sql,
-- applied right after this migration): a new argument would otherwise make
-- a second function beside the old one.
DROP FUNCTION IF EXISTS pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval,
                                       text, text, boolean, text);
