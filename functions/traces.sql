-- A job's W3C trace context (migration 0038, issue 39): how it gets there
-- from any producer, how a malformed one is refused without failing the
-- insert, and when it goes. Re-applied by `pgwake migrate` when changed.
--
-- A producer gives it in one of these ways; the first one given for a job
-- is kept:
--   SET LOCAL pgwake.traceparent = '00-…-…-01';  -- and pgwake.tracestate,
--   INSERT INTO pgwake.jobs …;                   -- any number of plain INSERTs
-- or `pgwake.enqueue(…, traceparent => …, tracestate => …)`, or the Rust
-- client's NewJob::traceparent (`pgwake enqueue --traceparent`, NDJSON
-- fields), which call pgwake.trace_job for each job they insert.

-- A `traceparent` of version 00, the only one defined
-- (https://www.w3.org/TR/trace-context/#traceparent-header): lowercase hex,
-- version not ff, neither id all zeros. A longer value (a later version's
-- extra fields, a 10 KB string) is refused by its length before any
-- pattern is matched.
CREATE OR REPLACE FUNCTION pgwake.traceparent_valid(traceparent text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(traceparent) <> 55 THEN false
                ELSE traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
                     AND left(traceparent, 2) <> 'ff'
                     AND substr(traceparent, 4, 32) <> repeat('0', 32)
                     AND substr(traceparent, 37, 16) <> repeat('0', 16) END
$$;

-- A `tracestate`: at most 512 bytes (what the specification asks a
-- platform to keep), printable ASCII only. Its list members are the
-- tracing vendors' business: kept as given.
CREATE OR REPLACE FUNCTION pgwake.tracestate_valid(tracestate text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(tracestate) > 512 THEN false
                ELSE tracestate !~ '[^ -~]' END
$$;

-- Record job `job_id`'s trace context; returns whether it was recorded (a
-- job that has one keeps it). NULL or '' `traceparent`: nothing to record.
-- A malformed `traceparent` is ignored, a malformed `tracestate` dropped:
-- each counts once in pgwake.trace_context_rejected (the worker publishes
-- it as pgwake_trace_context_rejected) and raises a WARNING, never an
-- error: a job is worth more than its trace. SECURITY DEFINER: producers
-- need no grant on the table or the counter.
CREATE OR REPLACE FUNCTION pgwake.trace_job(job_id bigint, traceparent text, tracestate text)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    state text := nullif(tracestate, '');
BEGIN
    IF traceparent IS NULL OR traceparent = '' THEN
        RETURN false;
    END IF;
    IF NOT pgwake.traceparent_valid(traceparent) THEN
        PERFORM nextval('pgwake.trace_context_rejected');
        -- The value as JSON (quoted, control characters escaped), cut.
        RAISE WARNING 'pgwake: job %: traceparent % (% bytes) is not a W3C traceparent: the job has no trace context',
            job_id, to_jsonb(left(traceparent, 64))::text, octet_length(traceparent)
            USING HINT = 'Version 00 is 00-<32 hex: trace id>-<16 hex: parent span id>-<2 hex: flags>, lowercase, neither id all zeros: what an OpenTelemetry propagator writes.';
        RETURN false;
    END IF;
    IF state IS NOT NULL AND NOT pgwake.tracestate_valid(state) THEN
        PERFORM nextval('pgwake.trace_context_rejected');
        RAISE WARNING 'pgwake: job %: tracestate % (% bytes) is not a W3C tracestate: the job keeps its traceparent without it',
            job_id, to_jsonb(left(state, 64))::text, octet_length(state)
            USING HINT = 'A tracestate is at most 512 bytes of printable ASCII.';
        state := NULL;
    END IF;
    INSERT INTO pgwake.job_traces AS t (job_id, traceparent, tracestate)
    VALUES (trace_job.job_id, trace_job.traceparent, state)
    ON CONFLICT ON CONSTRAINT job_traces_pkey DO NOTHING;
    RETURN FOUND;
END
$$;

-- The insert trigger jobs_trace_context: a job inserted in a transaction
-- that set pgwake.traceparent gets it (a plain INSERT, COPY, pgwake.enqueue,
-- the Rust client). Its WHEN clause reads the setting, so an insert
-- without one calls nothing. A job a worker puts back (tx mode) keeps its
-- context by its id: the worker's sessions set nothing.
CREATE OR REPLACE FUNCTION pgwake.trace_inserted_job() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    PERFORM pgwake.trace_job(NEW.id, current_setting('pgwake.traceparent', true),
                             current_setting('pgwake.tracestate', true));
    RETURN NULL;
END
$$;

-- Created only when missing, as jobs_notify (functions/notify.sql).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'jobs_trace_context' AND tgrelid = 'pgwake.jobs'::regclass) THEN
        CREATE TRIGGER jobs_trace_context
            AFTER INSERT ON pgwake.jobs
            FOR EACH ROW
            WHEN (current_setting('pgwake.traceparent', true) <> '')
            EXECUTE FUNCTION pgwake.trace_inserted_job();
    END IF;
END
$$;

-- The contexts of jobs that are gone (done without history, purged, or
-- aged out of the history), at most `batch` of them; returns how many.
-- Run by every worker's history maintenance (src/services/history.rs). A
-- job is in exactly one of these tables from the commit of each of its
-- moves on, so one snapshot never misses it; the context of a job whose
-- producer has not committed yet is not seen at all.
CREATE OR REPLACE FUNCTION pgwake.sweep_job_traces(batch bigint) RETURNS bigint
LANGUAGE sql AS $$
    WITH gone AS (
        DELETE FROM pgwake.job_traces t
        WHERE t.job_id = ANY(ARRAY(
            SELECT x.job_id FROM pgwake.job_traces x
            WHERE NOT EXISTS (SELECT FROM pgwake.jobs j WHERE j.id = x.job_id)
              AND NOT EXISTS (SELECT FROM pgwake.leased_jobs l WHERE l.id = x.job_id)
              AND NOT EXISTS (SELECT FROM pgwake.dead_jobs d WHERE d.id = x.job_id)
              AND NOT EXISTS (SELECT FROM pgwake.finished_jobs f WHERE f.id = x.job_id)
            LIMIT batch
            FOR UPDATE SKIP LOCKED))
        RETURNING 1
    )
    SELECT count(*) FROM gone
$$;
