-- How much work a queue has for workers now (issue 35, item 5): for
-- autoscalers (KEDA's postgresql trigger, deploy/kubernetes/) and for
-- producers that pace themselves. Answers in milliseconds however deep the
-- queue (docs/src/performance.md has the figure at 1,000,000 waiting jobs):
--
--   SELECT * FROM pgwake.queue_pressure('mail');         -- one row, always
--   SELECT * FROM pgwake.queue_pressure();               -- one row per queue
--   SELECT running + runnable FROM pgwake.queue_pressure('mail');  -- KEDA
--
-- Columns:
--   queue             the queue
--   runnable          jobs a worker could start now: 0 when the queue is
--                     paused, else ready, cut to the free slots of its
--                     max_running (max_running - running, at least 0) and
--                     to the admissions its rate has free now (slots whose
--                     last admission is a window old). Per-key limits and
--                     rates, and whether a live worker has a handler for
--                     the task, are not applied: with them, runnable is an
--                     upper bound.
--   ready             waiting jobs whose run_at has come, that are not held
--                     behind an earlier job of their ordering key and that
--                     no tx-mode claim is running, counted up to `cap`
--   running           jobs of the queue in flight: leased (running, in a
--                     worker's prefetch buffer, or expired until the
--                     rescuer moves them back) plus those tx-mode claims are
--                     running (the batch marks, pgwake.tx_batches, name
--                     them; a claim is seen once its mark is written, a few
--                     milliseconds after it takes its jobs). Not capped:
--                     at most what the workers hold.
--   oldest_ready_age  seconds the longest-waiting ready job has waited
--                     (since the later of its created_at and run_at, as the
--                     pickup latency and pgwake_queue_oldest_ready_age_seconds
--                     count it), whether or not limits let it start; 0 when
--                     none is ready
--   paused            whether the queue is paused (pgwake.pause_queue)
--   capped            whether `ready` stopped at the cap (there are at least
--                     that many), or the walk stopped at its bound of
--                     priorities (PRIORITIES_MAX below)
--
-- The cost is bounded, never a count(*) over the backlog. Ready jobs are
-- counted on jobs_queue_ready_idx (queue, priority, run_at, id; held jobs
-- are not in it), one priority at a time: a loose index scan finds the
-- queue's priorities (one probe each), and each priority's ready jobs are
-- the index range run_at <= now(), counted until `cap` in all; so jobs
-- scheduled for later are never walked, whatever their number. At most
-- 1,000 priorities are visited (a queue with more counts the first 1,000
-- and says capped). The in-flight jobs are the lease table's rows of the
-- queue (a scan of pgwake.leased_jobs, whose size is what the workers hold,
-- not the backlog) and the running batch marks' jobs (a primary-key probe
-- each). An unknown queue is a row of zeros (KEDA's trigger needs a row).
--
-- `queue_name` (not `queue`: that is the first column's name). `cap`: 1 to 1,000,000, default 10,000: an autoscaler dividing by a
-- worker's concurrency (say 10) reaches a thousand replicas before the cap
-- matters. Without a queue (NULL): one row per queue that has waiting jobs
-- that are not held, leased jobs or settings (pgwake.queues), by name; its
-- cost is the one-queue cost times the queues.
--
-- SECURITY DEFINER, so that a producer (pgwake.grant_producer), who may not
-- read the lease table, the batch marks or the settings, can pace itself on
-- the counts alone; granted to producers and monitors (functions/roles.sql),
-- never to PUBLIC. STABLE: one snapshot for the whole answer.
CREATE OR REPLACE FUNCTION pgwake.queue_pressure(queue_name text DEFAULT NULL, cap integer DEFAULT 10000)
RETURNS TABLE (queue text, runnable bigint, ready bigint, running bigint,
               oldest_ready_age float8, paused boolean, capped boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path = pg_catalog, pgwake
SET enable_seqscan = off SET jit = off SET plan_cache_mode = force_generic_plan AS $$
#variable_conflict use_column
DECLARE
    -- The most priorities one queue's walk visits.
    priorities_max constant integer := 1000;
    qname text := queue_pressure.queue_name;
    q record;
    prio integer;
    first_at timestamptz;
    first_id bigint;
    visited integer := 0;
    seen bigint := 0;
    budget bigint;
    n bigint;
    since timestamptz;
    first_since timestamptz;
    tx_ids bigint[];
    tx_running bigint;
    leased bigint;
    free_admissions bigint;
    out_ready bigint;
    out_runnable bigint;
    out_capped boolean := false;
BEGIN
    IF cap IS NULL OR cap NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'pgwake.queue_pressure: cap must be between 1 and 1000000, got %', cap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF qname IS NULL THEN
        -- Every queue: those with waiting jobs that are not held (a loose
        -- index scan of jobs_queue_ready_idx, one probe a queue), with
        -- leased jobs, or with settings.
        FOR q IN
            WITH RECURSIVE waiting AS (
                (SELECT j.queue FROM pgwake.jobs j WHERE NOT j.held ORDER BY j.queue LIMIT 1)
                UNION ALL
                SELECT (SELECT j.queue FROM pgwake.jobs j
                        WHERE NOT j.held AND j.queue > w.queue ORDER BY j.queue LIMIT 1)
                FROM waiting w WHERE w.queue IS NOT NULL
            )
            SELECT w.queue AS name FROM waiting w WHERE w.queue IS NOT NULL
            UNION
            SELECT DISTINCT l.queue FROM pgwake.leased_jobs l
            UNION
            SELECT s.name FROM pgwake.queues s
            ORDER BY 1
        LOOP
            RETURN QUERY SELECT * FROM pgwake.queue_pressure(q.name, cap);
        END LOOP;
        RETURN;
    END IF;

    SELECT s.paused, s.max_running, s.rate_count, s.rate_window INTO q
    FROM pgwake.queues s WHERE s.name = qname;

    -- Jobs tx-mode claims are running: rows their claim transaction has
    -- deleted but not committed, still visible here and still in the ready
    -- range of the index. A mark whose transaction aborted (a crash, a lost
    -- connection) names jobs that are back, ready; one whose transaction
    -- committed after this snapshot names rows that are gone for everyone
    -- after it. xids too old to know (NULL) are not running.
    SELECT coalesce(array_agg(DISTINCT j.id), '{}') INTO tx_ids
    FROM pgwake.tx_batches b
    CROSS JOIN LATERAL unnest(b.job_ids) AS u(id)
    JOIN pgwake.jobs j ON j.id = u.id
    WHERE j.queue = qname AND pg_xact_status(b.xid) IN ('in progress', 'committed');
    tx_running := cardinality(tx_ids);

    SELECT count(*) INTO leased FROM pgwake.leased_jobs l WHERE l.queue = qname;

    -- Ready jobs, priority by priority; the running tx-mode jobs are among
    -- them, so the budget counts them too and they are taken off after.
    -- Each priority's probe returns its first job this call sees (the
    -- function is STABLE: one snapshot for all its statements), and the
    -- count and the oldest job start there, not at the priority's first
    -- index entry: a held vacuum horizon leaves the entries of every job
    -- claimed since at the head of the range, each a heap visit for every
    -- read that starts there (none is dead to every snapshot), and the
    -- three reads from the head walked them three times (64-108 ms a call
    -- 2.3 minutes into a pin at 1,500 jobs/s, for a producer's loop that
    -- calls it every 200 ms). Row comparisons on exactly the index's
    -- columns, so that the scan starts at the probe's row and no index
    -- that does not lead with the queue can serve them (with `queue = $1`
    -- and `run_at <= now()` written out, the planner took jobs_run_at_idx
    -- beside a deeper later queue, and walked its jobs); enable_seqscan
    -- off, since a row comparison is estimated by its first column alone
    -- (`queue >= $1`: every later queue's jobs too), and at a million
    -- waiting jobs the count became a sequential scan. jit off: the cost
    -- enable_seqscan adds to the small tables' scans made the server
    -- compile them (50 ms a call). Generic plans from the first call: the
    -- plans made for a call's values (a session's first five) estimate from
    -- the index's ends, and under a held horizon that read walked the dead
    -- entries too (37-60 ms a call against 24).
    budget := cap + tx_running;
    SELECT j.priority, j.run_at, j.id INTO prio, first_at, first_id FROM pgwake.jobs j
    WHERE j.queue = qname AND NOT j.held
    ORDER BY j.queue, j.priority, j.run_at, j.id LIMIT 1;
    WHILE FOUND LOOP
        visited := visited + 1;
        IF seen < budget THEN
            SELECT count(*) INTO n FROM (
                SELECT FROM pgwake.jobs j
                WHERE (j.queue, j.priority, j.run_at, j.id) >= (qname, prio, first_at, first_id)
                  AND (j.queue, j.priority, j.run_at) <= (qname, prio, now())
                  AND NOT j.held
                LIMIT budget - seen) c;
            seen := seen + n;
        END IF;
        -- Each priority's first ready job (not running) is the one that
        -- has waited longest in it.
        SELECT greatest(j.created_at, j.run_at) INTO since FROM pgwake.jobs j
        WHERE (j.queue, j.priority, j.run_at, j.id) >= (qname, prio, first_at, first_id)
          AND (j.queue, j.priority, j.run_at) <= (qname, prio, now())
          AND NOT j.held AND j.id <> ALL (tx_ids)
        ORDER BY j.queue, j.priority, j.run_at, j.id LIMIT 1;
        IF FOUND AND (first_since IS NULL OR since < first_since) THEN
            first_since := since;
        END IF;
        IF visited >= priorities_max THEN
            -- More priorities may follow: their jobs were not counted.
            PERFORM FROM pgwake.jobs j
            WHERE j.queue = qname AND NOT j.held AND j.priority > prio LIMIT 1;
            out_capped := FOUND;
            EXIT;
        END IF;
        SELECT j.priority, j.run_at, j.id INTO prio, first_at, first_id FROM pgwake.jobs j
        WHERE j.queue = qname AND NOT j.held AND j.priority > prio
        ORDER BY j.queue, j.priority, j.run_at, j.id LIMIT 1;
    END LOOP;
    out_ready := greatest(0, least(cap, seen - tx_running));
    out_capped := out_capped OR out_ready >= cap;

    out_runnable := out_ready;
    IF coalesce(q.paused, false) THEN
        out_runnable := 0;
    END IF;
    IF q.max_running IS NOT NULL THEN
        out_runnable := least(out_runnable, greatest(0, q.max_running - (leased + tx_running)));
    END IF;
    IF q.rate_count IS NOT NULL AND out_runnable > 0 THEN
        -- Admission slots free now (src/db/sql/rate_reserve.sql takes the
        -- same ones), on queue_rate_slots_oldest_idx; no more than needed.
        SELECT count(*) INTO free_admissions FROM (
            SELECT FROM pgwake.queue_rate_slots s
            WHERE s.queue = qname AND s.last_start <= now() - q.rate_window
              AND s.slot <= q.rate_count
            LIMIT out_runnable) a;
        out_runnable := least(out_runnable, free_admissions);
    END IF;

    RETURN QUERY SELECT qname, out_runnable, out_ready, leased + tx_running,
        coalesce(greatest(0, extract(epoch FROM now() - first_since)), 0)::float8,
        coalesce(q.paused, false), out_capped;
END
$$;
