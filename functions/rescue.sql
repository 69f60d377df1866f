-- The rescue of expired leases, row by row (src/db/sql/rescue.sql calls
-- it; the rescuer service runs it on every worker). Each expired lease
-- (SKIP LOCKED: two rescuers at once move each job once) goes back to
-- pgwake.jobs, ready now (the insert trigger wakes every listening worker),
-- or, when that was its last attempt or its cancel was requested (its
-- worker died before it could stop it), to pgwake.dead_jobs. Each row moves
-- in a subtransaction of its own: one row that cannot be moved (say a
-- producer inserted a job with an explicit id equal to the leased job's)
-- is reported as failed with the server's message and stays leased, and
-- the others move all the same. Returns one row per lease: its queue, what
-- became of it (requeued, dead, failed), its id and the error.
CREATE OR REPLACE FUNCTION pgwake.rescue(batch bigint)
RETURNS TABLE (queue text, what text, job_id bigint, error text)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    l pgwake.leased_jobs;
    cancelled boolean;
BEGIN
    FOR l IN SELECT * FROM pgwake.leased_jobs x
             WHERE x.lease_until < now()
             ORDER BY x.lease_until
             LIMIT batch
             FOR UPDATE SKIP LOCKED
    LOOP
        queue := l.queue;
        job_id := l.id;
        error := NULL;
        BEGIN
            DELETE FROM pgwake.leased_jobs x WHERE x.token = l.token;
            cancelled := EXISTS (SELECT 1 FROM pgwake.cancel_requests r WHERE r.job_id = l.id);
            IF l.attempts < l.max_attempts AND NOT cancelled THEN
                INSERT INTO pgwake.jobs
                    (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                     last_error, created_at, timeout, ordering_key, unique_key, ordering_at,
                     limit_key)
                VALUES (l.id, l.queue, l.task, l.payload, l.priority, now(), l.attempts,
                        l.max_attempts,
                        format('lease expired on attempt %s (worker %s stopped heartbeating)',
                               l.attempts, l.worker_id),
                        l.created_at, l.timeout, l.ordering_key,
                        -- a job enqueued with this unique key meanwhile keeps
                        -- it; never waits (keys.sql)
                        pgwake.requeued_unique_key(l.unique_key),
                        coalesce(l.ordering_at, l.run_at), l.limit_key);
                what := 'requeued';
            ELSE
                INSERT INTO pgwake.dead_jobs AS d
                    (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                     last_error, created_at, timeout, worker_id, started_at, ordering_key,
                     unique_key, ordering_at, limit_key)
                VALUES (l.id, l.queue, l.task, l.payload, l.priority, l.run_at,
                        least(l.attempts, l.max_attempts), l.max_attempts,
                        CASE WHEN cancelled THEN 'cancelled'
                             ELSE format('lease expired on the last attempt (%s of %s; worker %s stopped heartbeating)',
                                         l.attempts, l.max_attempts, l.worker_id)
                        END,
                        l.created_at, l.timeout, l.worker_id, l.leased_at, l.ordering_key,
                        l.unique_key, l.ordering_at, l.limit_key)
                ON CONFLICT (id) DO UPDATE SET
                    queue = excluded.queue, task = excluded.task, payload = excluded.payload,
                    priority = excluded.priority, run_at = excluded.run_at,
                    attempts = excluded.attempts, max_attempts = excluded.max_attempts,
                    last_error = excluded.last_error, created_at = excluded.created_at,
                    timeout = excluded.timeout, worker_id = excluded.worker_id,
                    started_at = excluded.started_at, ordering_key = excluded.ordering_key,
                    unique_key = excluded.unique_key, ordering_at = excluded.ordering_at,
                    limit_key = excluded.limit_key, failed_at = now();
                what := 'dead';
            END IF;
        EXCEPTION WHEN OTHERS THEN
            what := 'failed';
            error := SQLERRM;
        END;
        RETURN NEXT;
    END LOOP;
END
$$;
