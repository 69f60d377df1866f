-- SQL admin API: SELECT pgwake.cancel(42);
--
-- Returns what became of the job:
--   'cancelled'         it was waiting (in pgwake.jobs, not claimed): it is
--                       now in pgwake.dead_jobs with last_error 'cancelled';
--   'cancel_requested'  it is running: the worker running it stops the
--                       handler (tx mode: its work rolled back) and then
--                       moves it to dead_jobs as cancelled (lease mode:
--                       fenced by its claim token; a lease whose worker is
--                       gone is buried as cancelled by the rescuer when it
--                       expires);
--   'dead'              it is already in pgwake.dead_jobs: nothing to cancel;
--   'finished'          it existed (its id was issued) and is neither queued,
--                       running nor dead: it finished (or was purged);
--   'not_found'         no job ever had this id.
--
-- A claim and a cancel cannot both win: a waiting job is taken with
-- FOR UPDATE SKIP LOCKED, the same lock a claim takes; a row that a claim
-- holds is a running job and gets a cancel request instead. A lease-mode
-- job that completes while its cancel is on the way is done (the request
-- is swept later); a later run of it cannot be hit by the request: `pgwake
-- dead retry` removes it.
CREATE OR REPLACE FUNCTION pgwake.cancel(job_id bigint) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    moved integer;
BEGIN
    -- A claim may commit between two of these statements; a job that went
    -- back to the queue in the meantime (a retry) is tried again as waiting.
    FOR attempt IN 1..3 LOOP
        -- Waiting: take it unless a claim holds it.
        WITH taken AS (
            DELETE FROM pgwake.jobs
            WHERE id = (SELECT j.id FROM pgwake.jobs j WHERE j.id = cancel.job_id
                        FOR UPDATE SKIP LOCKED)
            RETURNING *
        )
        INSERT INTO pgwake.dead_jobs
            (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
             created_at, timeout, ordering_key, unique_key, ordering_at, limit_key)
        SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, 'cancelled',
               created_at, timeout, ordering_key, unique_key, ordering_at, limit_key
        FROM taken
        ON CONFLICT (id) DO UPDATE SET
            queue = excluded.queue, task = excluded.task, payload = excluded.payload,
            priority = excluded.priority, run_at = excluded.run_at, attempts = excluded.attempts,
            max_attempts = excluded.max_attempts, last_error = excluded.last_error,
            created_at = excluded.created_at, timeout = excluded.timeout,
            ordering_key = excluded.ordering_key, unique_key = excluded.unique_key,
            ordering_at = excluded.ordering_at, limit_key = excluded.limit_key, failed_at = now();
        GET DIAGNOSTICS moved = ROW_COUNT;
        IF moved > 0 THEN
            RETURN 'cancelled';
        END IF;

        -- Running in lease mode: a request. The worker running it stops the
        -- handler and then buries it as cancelled, fenced by its claim
        -- token; if that worker is gone, the rescuer buries it when its
        -- lease expires. Either way it reaches dead_jobs only once its run
        -- has stopped, so a `pgwake dead retry` cannot start a second run
        -- beside the dying one.
        IF EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = cancel.job_id) THEN
            PERFORM pgwake.request_cancel(cancel.job_id);
            RETURN 'cancel_requested';
        END IF;

        -- Gone: finished (or never existed).
        IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = cancel.job_id) THEN
            EXIT;
        END IF;
        -- Still there but skipped above: a claim holds it, so it is running
        -- in tx mode. (A row that is there and free went back to the queue
        -- meanwhile; this transaction holds its lock now, so the next
        -- round's first statement takes it.)
        IF NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = cancel.job_id
                       FOR UPDATE SKIP LOCKED) THEN
            PERFORM pgwake.request_cancel(cancel.job_id);
            RETURN 'cancel_requested';
        END IF;
    END LOOP;
    IF EXISTS (SELECT 1 FROM pgwake.dead_jobs d WHERE d.id = cancel.job_id) THEN
        RETURN 'dead';
    END IF;
    -- Ids come from the table's identity sequence: one at or below its last
    -- value was issued to a job that has since left every table.
    IF cancel.job_id > 0 AND cancel.job_id <= coalesce(
           pg_sequence_last_value(pg_get_serial_sequence('pgwake.jobs', 'id')::regclass), 0) THEN
        RETURN 'finished';
    END IF;
    RETURN 'not_found';
END
$$;

-- Record a cancel request for a running job and tell the workers: the
-- notification (channel `pgwake_control`, payload `cancel <id>`) reaches a
-- listening worker at once; the row reaches every worker's poll, so a cancel
-- sent while a listener reconnects is not lost.
CREATE OR REPLACE FUNCTION pgwake.request_cancel(job_id bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO pgwake.cancel_requests AS r (job_id) VALUES (request_cancel.job_id)
    ON CONFLICT ON CONSTRAINT cancel_requests_pkey DO UPDATE SET requested_at = now();
    PERFORM pg_notify('pgwake_control', 'cancel ' || request_cancel.job_id);
END
$$;
