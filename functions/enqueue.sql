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
-- `traceparent`, `tracestate`: the producer's W3C trace context (migration
-- 0038, functions/traces.sql), as `SET LOCAL pgwake.traceparent` gives it to
-- every job of a transaction; given here, it is this job's, whatever the
-- transaction set. A malformed one is ignored with a WARNING.
-- `after`: the job's parents (migration 0039, functions/flows.sql): it is
-- held until every one has ended done, and released in the commit that
-- ends the last. At most pgwake.max_parents() (1,000); a parent that does
-- not exist, ended dead or cancelled, or ended without the history showing
-- it done is refused. `on_parent_failure`: what the job does when a
-- parent ends dead or cancelled: 'cancel' (default), 'run' or 'wait'
-- (docs/src/flows.md). A duplicate (`unique_key`) gets no parents.
-- `batch`: the batch (pgwake.batch_open) the job belongs to: its callback
-- runs after this job has ended, whatever its outcome (functions/flows.sql;
-- a duplicate is not added).
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
    limit_key    text        DEFAULT NULL,
    traceparent  text        DEFAULT NULL,
    tracestate   text        DEFAULT NULL,
    after        bigint[]    DEFAULT NULL,
    on_parent_failure text   DEFAULT NULL,
    batch        bigint      DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    given_parent text;
    given_state  text;
BEGIN
    -- The insert trigger jobs_trace_context records the context from the
    -- settings: set them for this insert alone, then put back the
    -- transaction's own.
    IF nullif(enqueue.traceparent, '') IS NOT NULL THEN
        given_parent := current_setting('pgwake.traceparent', true);
        given_state := current_setting('pgwake.tracestate', true);
        PERFORM set_config('pgwake.traceparent', enqueue.traceparent, true),
                set_config('pgwake.tracestate', coalesce(enqueue.tracestate, ''), true);
    END IF;
    IF enqueue.unique_key IS NULL THEN
        INSERT INTO pgwake.jobs (task, payload, queue, run_at, priority, max_attempts, timeout,
                                 ordering_key, limit_key)
        VALUES (enqueue.task, coalesce(enqueue.payload, '{}'::jsonb),
                coalesce(enqueue.queue, 'default'), coalesce(enqueue.run_at, now()),
                coalesce(enqueue.priority, 0), coalesce(enqueue.max_attempts, 25),
                enqueue.timeout, enqueue.ordering_key, enqueue.limit_key)
        RETURNING id, false AS duplicate INTO r;
    ELSE
        SELECT * INTO r FROM pgwake.enqueue_unique(enqueue.task, enqueue.payload, enqueue.queue,
            enqueue.run_at, enqueue.priority, enqueue.max_attempts, enqueue.timeout,
            enqueue.ordering_key, enqueue.unique_key, enqueue.unique_running, enqueue.limit_key);
    END IF;
    IF nullif(enqueue.traceparent, '') IS NOT NULL THEN
        PERFORM set_config('pgwake.traceparent', coalesce(given_parent, ''), true),
                set_config('pgwake.tracestate', coalesce(given_state, ''), true);
    END IF;
    IF cardinality(enqueue.after) > 0 AND NOT r.duplicate THEN
        PERFORM pgwake.add_parents(r.id, enqueue.after, enqueue.on_parent_failure);
    END IF;
    IF enqueue.batch IS NOT NULL AND NOT r.duplicate THEN
        PERFORM pgwake.batch_add(r.id, enqueue.batch);
    END IF;
    IF r.duplicate THEN
        RAISE NOTICE 'pgwake.enqueue: duplicate: job % already waits (or runs) with unique_key %',
            r.id, enqueue.unique_key;
    END IF;
    RETURN r.id;
END
$$;

-- The insert trigger jobs_bounds (migration 0027, BEFORE INSERT on
-- pgwake.jobs): the SQL API's own bounds on a new job, whichever way it is
-- inserted (a plain INSERT, COPY, pgwake.enqueue, the Rust client, `pgwake
-- enqueue`, a schedule's tick). The trigger's WHEN clause calls this only
-- for a new job (created_at not before this transaction: a job put back by
-- a worker keeps its payload) whose task name is over 256 bytes or whose
-- payload's datum is over 8 KiB or compressed: a payload whose JSON text
-- is over 64 KiB, the least the setting allows, always is, since the text
-- is at most six times the binary form (a control character: 1 byte, and
-- 6 as \u0001). So nearly every insert pays the WHEN clause alone.
-- SQLSTATE 54000 (program_limit_exceeded): the client and the CLI show the
-- message and hint as a usage error.
CREATE OR REPLACE FUNCTION pgwake.check_job_bounds() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    max_bytes integer;
    bytes     integer;
BEGIN
    IF octet_length(NEW.task) > 256 THEN
        RAISE EXCEPTION 'pgwake: a task name of % bytes: at most 256 bytes are allowed',
            octet_length(NEW.task)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'A task name names the handler that runs the job (pgwake run --handler TASK=...): put the data in the payload.';
    END IF;
    SELECT l.payload_max_bytes INTO max_bytes FROM pgwake.producer_limits l;
    max_bytes := coalesce(max_bytes, 1048576);
    bytes := octet_length(NEW.payload::text);
    IF bytes > max_bytes THEN
        -- The task as JSON: quoted, any control character escaped.
        RAISE EXCEPTION 'pgwake: the payload of a job of task % is % bytes as JSON text: at most % bytes are allowed',
            to_jsonb(left(NEW.task, 64))::text, bytes, max_bytes
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Keep large data elsewhere (a table, object storage) and put its key in the payload, or raise the limit: UPDATE pgwake.producer_limits SET payload_max_bytes = N (65536 to 268435456).';
    END IF;
    RETURN NEW;
END
$$;
