-- Why isn't job N running? `SELECT * FROM pgwake.explain(42)`: one row per
-- reason, the most decisive first, each naming what will end it:
--
--   reason         detail (what and what ends it)                   until           blocking_job
--   running        leased by worker W (lease mode) / in a tx claim  lease_until
--   progress       (after running) what its handler last reported:
--                  the value, its message, when (migration 0037)
--   process_wait   (after running) its worker's persistent handler
--                  had jobs waiting for a free process: it may be
--                  one, started but not yet on a process
--   buffered       claimed ahead by worker W into its prefetch      lease_until
--                  buffer, not started: starts when a slot frees
--   locked         its row is locked by another session's open
--                  transaction (pid, application, since): claims skip it
--   scheduled      runs at T                                        run_at
--   snoozed        snoozed until T by its handler, the Nth time     run_at
--   sleeping       sleeping until T by its handler (no attempt      run_at
--                  used; pgwake.job_waits, migration 0041)
--   waiting_for_signal  waiting for signal KEY until T (its timeout) run_at
--                  by its handler (no attempt used; migration 0042)
--                  (no attempt used; a warning past 100 snoozes)
--   retry_backoff  attempt N failed (error); retried at T           run_at
--   paused         queue Q is paused: pgwake queue resume Q; or paused by
--                  pressure: the governor's critical causes (horizon held
--                  3 min by pid 4711 (metabase)), resumed when it falls
--   ordering_key   behind job M on key K (M's state)                                M
--   max_running    Q runs its limit of N (jobs …)                                   one holder
--   rate_limit     Q started its limit of N per W; next admission   next admission
--   key_max_running key K of Q runs its limit of N (jobs …)                         one holder
--   key_rate_limit key K of Q started its limit of N per W           next admission
--   no_worker      no live worker works queue Q
--   no_handler     live workers work Q, none has a handler for T
--   saturated      every slot of the workers that can run it is busy
--   ready          nothing holds it: the next free worker takes it
--   dead           in pgwake.dead_jobs: its last error (`cancelled`: cancelled)
--   not_found      no waiting, running or dead job has this id
--
-- Read-only and lock-free (no row or advisory lock is taken): what it says
-- is what held a moment ago. Used by `pgwake explain`, `pgwake job show`
-- and the console; anything else may call it too.
-- Whether transaction `x` (a pgwake.jobs row's xmax) is a worker's tx-mode
-- claim that holds the row: a granted transaction lock whose backend runs
-- with a live worker's application_name, or a claim a tx batch mark names.
-- Anything else holding the row (a producer's SELECT … FOR UPDATE in an
-- open transaction) is not a run: the job waits, and claims skip it.
CREATE OR REPLACE FUNCTION pgwake.held_by_claim(x xid) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_locks pl
        WHERE pl.locktype = 'transactionid' AND pl.granted AND pl.transactionid = x
          AND (EXISTS (SELECT 1 FROM pgwake.tx_batches b WHERE xid(b.xid) = x)
               OR EXISTS (SELECT 1 FROM pg_stat_activity a
                          WHERE a.pid = pl.pid
                            AND a.application_name IN (SELECT w.application_name
                                                       FROM pgwake.live_workers w))))
$$;

-- A running job of `job_task` on one of `worker_ids` (registry ids) may
-- still wait for a persistent handler process with room (issue 34, item 8):
-- one row per pool of those workers that serves the task and had jobs
-- waiting at the worker's last renewal (`pgwake.workers.processes`,
-- migration 0029). The task's pool is the one listing it, else the
-- catch-all's (`*`) when the worker has no handler of its own for it.
CREATE OR REPLACE FUNCTION pgwake.explain_process_wait(job_task text, worker_ids text[])
RETURNS TABLE (reason text, detail text, until timestamptz, blocking_job bigint)
LANGUAGE sql STABLE AS $$
    SELECT 'process_wait'::text,
           format('worker %s''s persistent handler %s had %s job(s) waiting for a free process at its last report (%s), with %s of %s processes live and %s of %s in-flight places taken: this job may be one of them, started but not yet handed to a process; it goes to one when a place frees. More room: raise --processes, or the in-flight limit each process says in its hello (--inflight of the reference workers)',
                  w.id, quote_literal(p->>'command'), p->>'waiting', w.seen_at,
                  p->>'live', p->>'processes', p->>'in_flight', p->>'capacity'),
           NULL::timestamptz, NULL::bigint
    FROM pgwake.live_workers w
    CROSS JOIN LATERAL jsonb_array_elements(w.processes) p
    WHERE w.id = ANY(worker_ids)
      AND jsonb_typeof(p->'tasks') = 'array'
      AND (p->'tasks' ? job_task OR (p->'tasks' ? '*' AND NOT job_task = ANY(w.tasks)))
      AND jsonb_typeof(p->'waiting') = 'number' AND (p->>'waiting')::numeric > 0
    ORDER BY w.id, p->>'command'
$$;

-- Whether the progress row of job `job` written by the run `run_token`
-- (lease mode: its claim token) or `run_xid` (tx mode: its claim
-- transaction) belongs to the job's current run (migration 0037): the
-- token still holds the job's lease, or the claim transaction is still
-- open (it holds the job until it ends, so no other run of it can exist
-- meanwhile). Fences every progress write, and filters what readers show.
CREATE OR REPLACE FUNCTION pgwake.progress_current(job bigint, run_token bigint, run_xid xid8)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN run_token IS NOT NULL THEN EXISTS (
            SELECT 1 FROM pgwake.leased_jobs l WHERE l.token = run_token AND l.id = job)
        WHEN run_xid IS NOT NULL THEN coalesce(pg_xact_status(run_xid) = 'in progress', false)
        ELSE false
    END
$$;

-- The progress of each of `ids` that is running and reported some in its
-- current run: the value (JSON text), its message and when it was written.
-- Used by `pgwake job show`, the console's pages and pgwake.explain.
CREATE OR REPLACE FUNCTION pgwake.job_progress_of(ids bigint[])
RETURNS TABLE (job_id bigint, value text, message text, updated_at timestamptz)
LANGUAGE sql STABLE AS $$
    SELECT p.job_id, p.value::text, p.message, p.updated_at
    FROM pgwake.job_progress p
    WHERE p.job_id = ANY(ids) AND pgwake.progress_current(p.job_id, p.token, p.xid)
    ORDER BY p.job_id
$$;

-- Explain's `progress` row of a running job that reported some.
CREATE OR REPLACE FUNCTION pgwake.explain_progress(job bigint)
RETURNS TABLE (reason text, detail text, until timestamptz, blocking_job bigint)
LANGUAGE sql STABLE AS $$
    SELECT 'progress'::text,
           format('its handler reported %s%s at %s', p.value,
                  CASE WHEN p.message IS NULL THEN '' ELSE format(' (%s)', p.message) END,
                  p.updated_at),
           NULL::timestamptz, NULL::bigint
    FROM pgwake.job_progress_of(ARRAY[job]) p
$$;

CREATE OR REPLACE FUNCTION pgwake.explain(job_id bigint)
RETURNS TABLE (reason text, detail text, until timestamptz, blocking_job bigint)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    j record;
    l record;
    d record;
    q record;
    b record;
    running_ids bigint[];
    running_n bigint;
    next_admission timestamptz;
    key_limit integer;
    sz record;
    wt record;
    found_reason boolean := false;
BEGIN
    SELECT lj.worker_id, lj.lease_until, lj.attempts, lj.queue, lj.buffered, lj.leased_at, lj.task
    INTO l FROM pgwake.leased_jobs lj WHERE lj.id = job_id;
    IF FOUND AND l.buffered THEN
        -- Claimed ahead of the worker's free slots (migration 0024); the
        -- worker clears the mark, asynchronously, when the job starts.
        RETURN QUERY SELECT 'buffered'::text,
            format('lease mode, attempt %s, claimed ahead by worker %s into its prefetch buffer at %s, not started: it starts when one of that worker''s slots frees, or goes back to the queue, attempt refunded, if no slot frees for --prefetch-wait, the worker stops, or its queue is paused or limited',
                   l.attempts, l.worker_id, l.leased_at),
            l.lease_until, NULL::bigint;
        RETURN;
    ELSIF FOUND THEN
        RETURN QUERY SELECT 'running'::text,
            format('lease mode, attempt %s, leased by worker %s; its lease is renewed while it runs',
                   l.attempts, l.worker_id),
            l.lease_until, NULL::bigint;
        RETURN QUERY SELECT * FROM pgwake.explain_progress(job_id);
        RETURN QUERY SELECT * FROM pgwake.explain_process_wait(l.task, ARRAY[l.worker_id]);
        RETURN;
    END IF;

    SELECT jb.queue, jb.task, jb.run_at, jb.priority, jb.attempts, jb.max_attempts, jb.last_error,
           jb.ordering_key, coalesce(jb.ordering_at, jb.run_at) AS key_at, jb.xmax, jb.limit_key,
           jb.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                       WHERE pl.locktype = 'transactionid' AND pl.granted) AS in_tx,
           jb.parents_open
    INTO j FROM pgwake.jobs jb WHERE jb.id = job_id;
    IF NOT FOUND THEN
        SELECT dj.last_error, dj.failed_at INTO d FROM pgwake.dead_jobs dj WHERE dj.id = job_id;
        IF FOUND THEN
            RETURN QUERY SELECT
                CASE WHEN d.last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
                format('in pgwake.dead_jobs since %s: %s; `pgwake dead retry --id %s` runs it again',
                       d.failed_at, d.last_error, job_id),
                NULL::timestamptz, NULL::bigint;
        ELSE
            RETURN QUERY SELECT 'not_found'::text,
                'no waiting, running or dead job has this id: it finished (see `pgwake history`, when history is on) or never existed'::text,
                NULL::timestamptz, NULL::bigint;
        END IF;
        RETURN;
    END IF;

    IF j.in_tx AND pgwake.held_by_claim(j.xmax) THEN
        RETURN QUERY SELECT 'running'::text,
            format('tx mode, attempt %s: a worker''s claim transaction holds it until its handler ends', j.attempts + 1),
            NULL::timestamptz, NULL::bigint;
        RETURN QUERY SELECT * FROM pgwake.explain_progress(job_id);
        -- Its worker: the batch's mark names it; before the mark, the
        -- workers of the holding backend's application_name.
        RETURN QUERY SELECT * FROM pgwake.explain_process_wait(j.task, coalesce(
            nullif(ARRAY(SELECT b2.worker_id FROM pgwake.tx_batches b2 WHERE xid(b2.xid) = j.xmax), '{}'),
            ARRAY(SELECT w.id FROM pg_locks pl
                  JOIN pg_stat_activity a ON a.pid = pl.pid
                  JOIN pgwake.live_workers w ON w.application_name = a.application_name
                  WHERE pl.locktype = 'transactionid' AND pl.granted AND pl.transactionid = j.xmax)));
        RETURN;
    ELSIF j.in_tx THEN
        -- Another session holds the row: claims skip locked rows.
        found_reason := true;
        RETURN QUERY SELECT 'locked'::text,
            coalesce((SELECT format('its row is locked by the open transaction of another session (pid %s, application %s, %s since %s): claims skip locked rows until that transaction ends',
                                    a.pid, quote_literal(coalesce(a.application_name, '')),
                                    coalesce(a.state, 'state unknown'), a.xact_start)
                      FROM pg_locks pl JOIN pg_stat_activity a ON a.pid = pl.pid
                      WHERE pl.locktype = 'transactionid' AND pl.granted
                        AND pl.transactionid = j.xmax
                      LIMIT 1),
                     'its row is locked by the open transaction of another session: claims skip locked rows until that transaction ends'),
            NULL::timestamptz, NULL::bigint;
    END IF;

    IF j.parents_open > 0 AND EXISTS (SELECT 1 FROM pgwake.batches bt
                                      WHERE bt.id = job_id AND bt.released_at IS NULL) THEN
        -- A batch's callback (migration 0044): its batch's counts, read
        -- from the batch's row, not its (up to 100,000) edges.
        found_reason := true;
        RETURN QUERY
        SELECT 'waiting_for_parents'::text,
            CASE WHEN bt.closed_at IS NULL
                 THEN format('the callback of batch %s, which is open: %s of its %s jobs have ended; it runs once the batch is closed (pgwake batch close %s; else by the rescuer at %s) and every job of it has ended',
                             job_id, bt.ended, bt.added, job_id, bt.close_by)
                 ELSE format('the callback of batch %s, closed: waiting for %s of its %s jobs; it is released in the commit that ends the last (pgwake batch status %s)',
                             job_id, bt.added - bt.ended, bt.added, job_id) END,
            CASE WHEN bt.closed_at IS NULL THEN bt.close_by END,
            NULL::bigint
        FROM pgwake.batches bt WHERE bt.id = job_id;
    ELSIF j.parents_open > 0 THEN
        -- Held for its parents (migration 0039, functions/flows.sql): the
        -- open ones (at most 10 named) and their states.
        found_reason := true;
        RETURN QUERY
        WITH e AS (
            SELECT x.parent, x.on_failure, x.state FROM pgwake.job_parents x
            WHERE x.child = job_id
        ), open AS (
            SELECT e.parent,
                   CASE WHEN EXISTS (SELECT 1 FROM pgwake.leased_jobs lj WHERE lj.id = e.parent)
                            THEN 'running'
                        WHEN EXISTS (SELECT 1 FROM pgwake.jobs jb WHERE jb.id = e.parent
                                     AND jb.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                                                     WHERE pl.locktype = 'transactionid' AND pl.granted)
                                     AND pgwake.held_by_claim(jb.xmax))
                            THEN 'running'
                        WHEN EXISTS (SELECT 1 FROM pgwake.jobs jb WHERE jb.id = e.parent AND jb.parents_open > 0)
                            THEN 'waiting for its own parents'
                        WHEN EXISTS (SELECT 1 FROM pgwake.jobs jb WHERE jb.id = e.parent)
                            THEN 'waiting'
                        WHEN EXISTS (SELECT 1 FROM pgwake.dead_jobs dj WHERE dj.id = e.parent)
                            THEN 'dead: this job waits for its retry'
                        ELSE 'ended: the rescuer''s sweep releases this job'
                   END AS state
            FROM e WHERE e.state <> 'done'
        )
        SELECT 'waiting_for_parents'::text,
            format('waiting for %s of %s parents: %s%s; it is released in the commit that ends the last',
                   j.parents_open, (SELECT count(*) FROM e),
                   (SELECT string_agg(format('%s (%s)', o.parent, o.state), ', ' ORDER BY o.parent)
                    FROM (SELECT * FROM open ORDER BY open.parent LIMIT 10) o),
                   CASE WHEN (SELECT count(*) FROM open) > 10
                        THEN format(' and %s more', (SELECT count(*) FROM open) - 10) ELSE '' END),
            NULL::timestamptz, (SELECT min(o.parent) FROM open o);
    END IF;

    SELECT sn.snoozes, sn.snoozed_until, sn.snoozed_at INTO sz
    FROM pgwake.job_snoozes sn WHERE sn.job_id = explain.job_id;
    SELECT w.kind, w.wait_until, w.signal_key, w.signal_state INTO wt
    FROM pgwake.job_waits w WHERE w.job_id = explain.job_id;
    IF j.run_at > now() THEN
        found_reason := true;
        IF wt.kind = 'signal' AND wt.wait_until = j.run_at AND wt.signal_state = 'waiting' THEN
            -- Its wait for a signal set this run_at (migration 0042).
            RETURN QUERY SELECT 'waiting_for_signal'::text,
                format('waiting for signal %L until %s by its handler (then resumes timed out; pgwake signal KEY wakes it; no attempt used: %s of %s used; holds no slot)',
                       wt.signal_key, j.run_at, j.attempts, j.max_attempts),
                j.run_at, NULL::bigint;
        ELSIF wt.kind = 'sleep' AND wt.wait_until = j.run_at THEN
            -- Its last sleep set this run_at (migration 0041).
            RETURN QUERY SELECT 'sleeping'::text,
                format('sleeping until %s by its handler (no attempt used: %s of %s used; holds no slot)',
                       j.run_at, j.attempts, j.max_attempts),
                j.run_at, NULL::bigint;
        ELSIF sz.snoozed_until IS NOT DISTINCT FROM j.run_at THEN
            -- Its last snooze set this run_at (migration 0034).
            RETURN QUERY SELECT 'snoozed'::text,
                format('snoozed until %s by its handler, the %s time (no attempt used: %s of %s used)%s',
                       j.run_at,
                       sz.snoozes || CASE WHEN sz.snoozes % 100 IN (11, 12, 13) THEN 'th'
                                          WHEN sz.snoozes % 10 = 1 THEN 'st'
                                          WHEN sz.snoozes % 10 = 2 THEN 'nd'
                                          WHEN sz.snoozes % 10 = 3 THEN 'rd'
                                          ELSE 'th' END,
                       j.attempts, j.max_attempts,
                       CASE WHEN sz.snoozes > 100 THEN format(
                           '; warning: more than 100 snoozes: is its handler waiting for something that never comes? `pgwake cancel %s` stops it', job_id)
                       ELSE '' END),
                j.run_at, NULL::bigint;
        ELSIF j.attempts > 0 THEN
            RETURN QUERY SELECT 'retry_backoff'::text,
                format('attempt %s failed (%s); retried at %s', j.attempts,
                       coalesce(j.last_error, 'no error recorded'), j.run_at),
                j.run_at, NULL::bigint;
        ELSE
            RETURN QUERY SELECT 'scheduled'::text, format('runs at %s', j.run_at),
                j.run_at, NULL::bigint;
        END IF;
    END IF;

    SELECT qs.paused, qs.paused_at, qs.paused_by, qs.max_running, qs.rate_count, qs.rate_window,
           qs.key_limits, qs.max_running_per_key, qs.key_rate_count, qs.key_rate_window
    INTO q FROM pgwake.queues qs WHERE qs.name = j.queue;
    IF FOUND AND q.paused AND q.paused_by = 'pressure' THEN
        -- Shed by the governor (functions/pressure.sql): say why, from the
        -- causes recorded at the change to critical.
        found_reason := true;
        RETURN QUERY SELECT 'paused'::text,
            format('paused by pressure (since %s): %s; queue %s resumes when the database pressure falls below critical (or `pgwake queue resume %s`)',
                   q.paused_at,
                   coalesce((SELECT string_agg(c->>'detail', '; ')
                             FROM pgwake.pressure_state ps, jsonb_array_elements(ps.causes) c
                             WHERE c->>'level' = 'critical'), 'the database pressure is critical'),
                   quote_literal(j.queue), quote_literal(j.queue)),
            NULL::timestamptz, NULL::bigint;
    ELSIF FOUND AND q.paused THEN
        found_reason := true;
        RETURN QUERY SELECT 'paused'::text,
            format('queue %s is paused (since %s): no job of it starts until `pgwake queue resume %s`',
                   quote_literal(j.queue), q.paused_at, quote_literal(j.queue)),
            NULL::timestamptz, NULL::bigint;
    END IF;

    IF j.ordering_key IS NOT NULL THEN
        SELECT CASE WHEN lj.buffered THEN 'buffered by worker ' || lj.worker_id
                    ELSE 'running (lease mode)' END AS state, lj.id INTO b
        FROM pgwake.leased_jobs lj WHERE lj.ordering_key = j.ordering_key
        ORDER BY lj.id LIMIT 1;
        IF NOT FOUND THEN
            SELECT CASE
                       WHEN jb.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                                        WHERE pl.locktype = 'transactionid' AND pl.granted)
                            AND pgwake.held_by_claim(jb.xmax)
                           THEN 'running (tx mode)'
                       WHEN jb.run_at > now() AND jb.attempts > 0 THEN 'waiting to retry at ' || jb.run_at
                       WHEN jb.run_at > now() THEN 'scheduled for ' || jb.run_at
                       ELSE 'waiting'
                   END AS state, jb.id
            INTO b FROM pgwake.jobs jb
            WHERE jb.ordering_key = j.ordering_key
              AND (jb.priority, coalesce(jb.ordering_at, jb.run_at), jb.id)
                  < (j.priority, j.key_at, job_id)
            ORDER BY jb.priority, coalesce(jb.ordering_at, jb.run_at), jb.id
            LIMIT 1;
        END IF;
        IF FOUND THEN
            found_reason := true;
            RETURN QUERY SELECT 'ordering_key'::text,
                format('behind job %s on ordering key %s (job %s is %s): it starts when every earlier job of the key has ended',
                       b.id, quote_literal(j.ordering_key), b.id, b.state),
                NULL::timestamptz, b.id::bigint;
        END IF;
    END IF;

    IF q.max_running IS NOT NULL THEN
        SELECT array_agg(r.id ORDER BY r.id), count(*) INTO running_ids, running_n FROM (
            SELECT lj.id FROM pgwake.leased_jobs lj WHERE lj.queue = j.queue
            UNION ALL
            SELECT jb.id FROM pgwake.jobs jb
            WHERE jb.queue = j.queue
              AND jb.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                              WHERE pl.locktype = 'transactionid' AND pl.granted)
              AND pgwake.held_by_claim(jb.xmax)
        ) r;
        IF running_n >= q.max_running THEN
            found_reason := true;
            RETURN QUERY SELECT 'max_running'::text,
                format('queue %s runs its limit of %s job(s) at once (running: %s): one must end first',
                       quote_literal(j.queue), q.max_running,
                       array_to_string(running_ids[1:10], ', ')
                       || CASE WHEN running_n > 10 THEN ', …' ELSE '' END),
                NULL::timestamptz, running_ids[1];
        END IF;
    END IF;

    IF q.rate_count IS NOT NULL THEN
        SELECT min(rs.last_start) + q.rate_window INTO next_admission
        FROM pgwake.queue_rate_slots rs WHERE rs.queue = j.queue;
        IF next_admission IS NOT NULL AND next_admission > now()
           AND (SELECT count(*) FROM pgwake.queue_rate_slots rs WHERE rs.queue = j.queue) >= q.rate_count THEN
            found_reason := true;
            RETURN QUERY SELECT 'rate_limit'::text,
                format('queue %s started its limit of %s job(s) per %s; the next start is admitted at %s',
                       quote_literal(j.queue), q.rate_count, q.rate_window, next_admission),
                next_admission, NULL::bigint;
        END IF;
    END IF;

    -- Per-key limits (migrations 0020, 0021): the job's limit key at its
    -- running limit (the key's own, else the queue's per key), or its key's
    -- rate used up.
    IF j.limit_key IS NOT NULL AND q.key_limits THEN
        key_limit := coalesce((SELECT kl.max_running FROM pgwake.queue_key_limits kl
                               WHERE kl.queue = j.queue AND kl.limit_key = j.limit_key),
                              q.max_running_per_key);
        SELECT array_agg(r.id ORDER BY r.id), count(*) INTO running_ids, running_n FROM (
            SELECT lj.id FROM pgwake.leased_jobs lj
            WHERE lj.queue = j.queue AND lj.limit_key = j.limit_key
            UNION ALL
            SELECT jb.id FROM pgwake.jobs jb
            WHERE jb.queue = j.queue AND jb.limit_key = j.limit_key
              AND jb.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                              WHERE pl.locktype = 'transactionid' AND pl.granted)
              AND pgwake.held_by_claim(jb.xmax)
        ) r;
        IF key_limit IS NOT NULL AND running_n >= key_limit THEN
            found_reason := true;
            RETURN QUERY SELECT 'key_max_running'::text,
                format('limit key %s of queue %s runs its limit of %s job(s) at once (running: %s): one must end first',
                       quote_literal(j.limit_key), quote_literal(j.queue), key_limit,
                       array_to_string(running_ids[1:10], ', ')
                       || CASE WHEN running_n > 10 THEN ', …' ELSE '' END),
                NULL::timestamptz, running_ids[1];
        END IF;
    END IF;

    IF j.limit_key IS NOT NULL AND q.key_rate_count IS NOT NULL THEN
        SELECT min(ks.last_start) + q.key_rate_window INTO next_admission
        FROM pgwake.key_rate_slots ks
        WHERE ks.queue = j.queue AND ks.limit_key = j.limit_key AND ks.slot <= q.key_rate_count
          AND ks.last_start > now() - q.key_rate_window;
        IF next_admission IS NOT NULL
           AND (SELECT count(*) FROM pgwake.key_rate_slots ks
                WHERE ks.queue = j.queue AND ks.limit_key = j.limit_key
                  AND ks.slot <= q.key_rate_count
                  AND ks.last_start > now() - q.key_rate_window) >= q.key_rate_count THEN
            found_reason := true;
            RETURN QUERY SELECT 'key_rate_limit'::text,
                format('limit key %s of queue %s started its limit of %s job(s) per %s; the key''s next start is admitted at %s',
                       quote_literal(j.limit_key), quote_literal(j.queue), q.key_rate_count,
                       q.key_rate_window, next_admission),
                next_admission, NULL::bigint;
        END IF;
    END IF;

    IF NOT EXISTS (SELECT 1 FROM pgwake.live_workers w
                   WHERE w.queues IS NULL OR j.queue = ANY(w.queues)) THEN
        found_reason := true;
        RETURN QUERY SELECT 'no_worker'::text,
            format('no live worker works queue %s: start one (`pgwake run`, with the queue in --queues if it lists queues)',
                   quote_literal(j.queue)),
            NULL::timestamptz, NULL::bigint;
    ELSIF NOT EXISTS (SELECT 1 FROM pgwake.live_workers w
                      WHERE (w.queues IS NULL OR j.queue = ANY(w.queues))
                        AND ('*' = ANY(w.tasks) OR j.task = ANY(w.tasks))) THEN
        found_reason := true;
        RETURN QUERY SELECT 'no_handler'::text,
            -- The flag as a shell takes it: a task name of other
            -- characters than these is single-quoted, its quotes escaped.
            format('live workers work queue %s, but none has a handler for task %s: deploy one with `--handler %s`',
                   quote_literal(j.queue), quote_literal(j.task),
                   CASE WHEN j.task ~ '^[A-Za-z0-9_.:/@%+-]+$' THEN j.task || '=…'
                        ELSE '''' || replace(j.task, '''', '''\''''') || '=…''' END),
            NULL::timestamptz, NULL::bigint;
    END IF;

    IF NOT found_reason THEN
        -- Every slot of the live workers that can run it busy, as of their
        -- last report (the registry, renewed every few seconds).
        SELECT coalesce(sum(w.concurrency), 0) AS slots, coalesce(sum(w.running), 0) AS busy,
               count(*) AS workers
        INTO b FROM pgwake.live_workers w
        WHERE (w.queues IS NULL OR j.queue = ANY(w.queues))
          AND ('*' = ANY(w.tasks) OR j.task = ANY(w.tasks));
        IF b.slots > 0 AND b.busy >= b.slots THEN
            found_reason := true;
            RETURN QUERY SELECT 'saturated'::text,
                format('every slot of the %s live worker(s) that can run it is busy (%s of %s running, as of their last report): it starts when one frees; more workers or --concurrency add slots',
                       b.workers, b.busy, b.slots),
                NULL::timestamptz, NULL::bigint;
        END IF;
    END IF;

    IF NOT found_reason THEN
        RETURN QUERY SELECT 'ready'::text,
            format('nothing holds it; the next free worker takes it (%s ready job(s) of queue %s ahead of it in claim order)',
                   (SELECT count(*) FROM (
                        SELECT 1 FROM pgwake.jobs jb
                        WHERE jb.queue = j.queue AND jb.run_at <= now()
                          AND (jb.priority, jb.run_at, jb.id) < (j.priority, j.run_at, job_id)
                        LIMIT 100000) a),
                   quote_literal(j.queue)),
            NULL::timestamptz, NULL::bigint;
    END IF;
END
$$;

-- Jobs in every state, filtered, keyset-paginated by id: the rows behind
-- `pgwake jobs list` and the console's Jobs page. `state`: waiting (ready
-- now), scheduled (later, retries included), running (lease mode, and tx
-- mode: rows a claim transaction holds), buffered (lease mode: claimed
-- ahead into a worker's prefetch buffer, not started), dead, cancelled, finished
-- (history, when on), or NULL for every state but finished. Each filter
-- NULL: any. `payload`: jobs whose payload contains it (`@>`). `since`: jobs
-- enqueued (waiting, scheduled, running), failed or cancelled (dead,
-- cancelled) or finished (history) at or after it. Ids above `after_id`,
-- ascending, at most `page` rows (1 to 1000).
DROP FUNCTION IF EXISTS pgwake.list_jobs(text, text, text, text, text, jsonb, bigint, integer);
-- Its result gained job_limit_key (migration 0020): a result type is not
-- changed by CREATE OR REPLACE.
DROP FUNCTION IF EXISTS pgwake.list_jobs(text, text, text, text, text, jsonb, bigint, integer,
                                         timestamptz);
CREATE OR REPLACE FUNCTION pgwake.list_jobs(
    state        text    DEFAULT NULL,
    queue        text    DEFAULT NULL,
    task         text    DEFAULT NULL,
    ordering_key text    DEFAULT NULL,
    unique_key   text    DEFAULT NULL,
    payload      jsonb   DEFAULT NULL,
    after_id     bigint  DEFAULT 0,
    page         integer DEFAULT 100,
    since        timestamptz DEFAULT NULL)
RETURNS TABLE (id bigint, job_state text, job_queue text, job_task text, priority integer,
               attempts integer, max_attempts integer, run_at timestamptz,
               created_at timestamptz, job_ordering_key text, job_unique_key text,
               worker text, last_error text, job_limit_key text)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    lim integer := least(greatest(coalesce(page, 100), 1), 1000);
BEGIN
    IF state IS NOT NULL AND state NOT IN
       ('waiting', 'scheduled', 'running', 'buffered', 'dead', 'cancelled', 'finished') THEN
        RAISE EXCEPTION 'unknown job state %: use waiting, scheduled, running, buffered, dead, cancelled or finished', quote_literal(state)
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT * FROM (
        SELECT j.id,
               CASE WHEN j.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                                    WHERE pl.locktype = 'transactionid' AND pl.granted)
                         AND pgwake.held_by_claim(j.xmax) THEN 'running'
                    WHEN j.run_at > now() THEN 'scheduled'
                    ELSE 'waiting' END AS s,
               j.queue, j.task, j.priority, j.attempts, j.max_attempts, j.run_at, j.created_at,
               j.ordering_key, j.unique_key, NULL::text, j.last_error, j.limit_key
        FROM pgwake.jobs j
        WHERE (state IS NULL OR state IN ('waiting', 'scheduled', 'running'))
          AND j.id > coalesce(after_id, 0)
          AND (list_jobs.queue IS NULL OR j.queue = list_jobs.queue)
          AND (list_jobs.task IS NULL OR j.task = list_jobs.task)
          AND (list_jobs.ordering_key IS NULL OR j.ordering_key = list_jobs.ordering_key)
          AND (list_jobs.unique_key IS NULL OR j.unique_key = list_jobs.unique_key)
          AND (list_jobs.payload IS NULL OR j.payload @> list_jobs.payload)
          AND (list_jobs.since IS NULL OR j.created_at >= list_jobs.since)
        UNION ALL
        SELECT l.id, CASE WHEN l.buffered THEN 'buffered' ELSE 'running' END,
               l.queue, l.task, l.priority, l.attempts, l.max_attempts, l.run_at,
               l.created_at, l.ordering_key, l.unique_key, l.worker_id, l.last_error, l.limit_key
        FROM pgwake.leased_jobs l
        WHERE (state IS NULL OR state IN ('running', 'buffered'))
          AND l.id > coalesce(after_id, 0)
          AND (list_jobs.queue IS NULL OR l.queue = list_jobs.queue)
          AND (list_jobs.task IS NULL OR l.task = list_jobs.task)
          AND (list_jobs.ordering_key IS NULL OR l.ordering_key = list_jobs.ordering_key)
          AND (list_jobs.unique_key IS NULL OR l.unique_key = list_jobs.unique_key)
          AND (list_jobs.payload IS NULL OR l.payload @> list_jobs.payload)
          AND (list_jobs.since IS NULL OR l.created_at >= list_jobs.since)
        UNION ALL
        SELECT d.id, CASE WHEN d.last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               d.queue, d.task, d.priority, d.attempts, d.max_attempts, d.run_at, d.created_at,
               d.ordering_key, d.unique_key, NULL::text, d.last_error, d.limit_key
        FROM pgwake.dead_jobs d
        WHERE (state IS NULL OR state IN ('dead', 'cancelled'))
          AND (state IS NULL OR (state = 'cancelled') = (d.last_error = 'cancelled'))
          AND d.id > coalesce(after_id, 0)
          AND (list_jobs.queue IS NULL OR d.queue = list_jobs.queue)
          AND (list_jobs.task IS NULL OR d.task = list_jobs.task)
          AND (list_jobs.ordering_key IS NULL OR d.ordering_key = list_jobs.ordering_key)
          AND (list_jobs.unique_key IS NULL OR d.unique_key = list_jobs.unique_key)
          AND (list_jobs.payload IS NULL OR d.payload @> list_jobs.payload)
          AND (list_jobs.since IS NULL OR d.failed_at >= list_jobs.since)
        UNION ALL
        SELECT f.id, f.outcome, f.queue, f.task, NULL::integer, f.attempts, NULL::integer, NULL::timestamptz,
               f.enqueued_at, NULL::text, f.unique_key, f.worker, f.error, f.limit_key
        FROM pgwake.finished_jobs f
        WHERE state = 'finished'
          AND f.id > coalesce(after_id, 0)
          AND (list_jobs.queue IS NULL OR f.queue = list_jobs.queue)
          AND (list_jobs.task IS NULL OR f.task = list_jobs.task)
          AND (list_jobs.unique_key IS NULL OR f.unique_key = list_jobs.unique_key)
          AND (list_jobs.payload IS NULL OR f.payload @> list_jobs.payload)
          AND (list_jobs.since IS NULL OR f.finished_at >= list_jobs.since)
    ) all_jobs (id, s, q, t, p, a, m, r, c, ok, uk, w, e, lk)
    WHERE state IS NULL OR state = 'finished' OR all_jobs.s = state
    ORDER BY all_jobs.id
    LIMIT lim;
END
$$;

-- Every attempt's error (migration 0019): a job inserted with an error and
-- attempts behind it (put back after a failure or a rescue, or buried)
-- records that attempt's error once. SECURITY DEFINER: the roles that move
-- jobs need no grant on the log.
CREATE OR REPLACE FUNCTION pgwake.record_job_error() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO pgwake.job_errors (job_id, attempt, error)
    VALUES (NEW.id, NEW.attempts, NEW.last_error)
    ON CONFLICT (job_id, attempt) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER jobs_record_error
    AFTER INSERT ON pgwake.jobs
    FOR EACH ROW WHEN (NEW.last_error IS NOT NULL AND NEW.attempts > 0)
    EXECUTE FUNCTION pgwake.record_job_error();

CREATE OR REPLACE TRIGGER dead_jobs_record_error
    AFTER INSERT ON pgwake.dead_jobs
    FOR EACH ROW WHEN (NEW.last_error IS NOT NULL AND NEW.attempts > 0)
    EXECUTE FUNCTION pgwake.record_job_error();

-- Dead and cancelled jobs into the history (migration 0006; its triggers
-- on pgwake.dead_jobs run this for every bury path: a worker's bury in
-- either mode, a rescue on the last attempt, a cancel), with the job's
-- keys: ordering and unique (migration 0008) and limit key (migration
-- 0020; the done paths, src/db/sql/history_done.sql and
-- lease_done_history.sql, record it too).
CREATE OR REPLACE FUNCTION pgwake.record_dead() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgwake.history_settings WHERE keep IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pgwake.finished_jobs
            (id, queue, task, payload, outcome, error, attempts, enqueued_at, started_at,
             finished_at, worker, ordering_key, unique_key, limit_key)
        SELECT id, queue, task, payload,
               CASE WHEN last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               last_error, attempts, created_at, started_at, clock_timestamp(), worker_id,
               ordering_key, unique_key, limit_key
        FROM new_rows;
    ELSE
        -- A bury that found the id already dead (ON CONFLICT … DO UPDATE
        -- sets failed_at): a new death. Other updates are not.
        INSERT INTO pgwake.finished_jobs
            (id, queue, task, payload, outcome, error, attempts, enqueued_at, started_at,
             finished_at, worker, ordering_key, unique_key, limit_key)
        SELECT n.id, n.queue, n.task, n.payload,
               CASE WHEN n.last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               n.last_error, n.attempts, n.created_at, n.started_at, clock_timestamp(), n.worker_id,
               n.ordering_key, n.unique_key, n.limit_key
        FROM new_rows n JOIN old_rows o USING (id)
        WHERE n.failed_at IS DISTINCT FROM o.failed_at;
    END IF;
    RETURN NULL;
END
$$;
