-- lease-mode claim from one queue ($2) that has a max_running limit
-- (migration 0009), a rate limit (migration 0010) or fair keys (migration
-- 0020). $1: limit, $3: only these tasks (NULL: any), $4: never these
-- tasks, $5: worker id, $6: lease seconds, $7: admissions the worker
-- reserved for this claim (src/db/sql/rate_reserve.sql; NULL: the queue has
-- no rate limit), $8: the last limit key this worker served of the queue
-- (fair keys; NULL: none), $9: the limit keys admitted for this claim under
-- a per-key rate, one entry per admission (pgwake.reserve_key_admissions;
-- NULL: none reserved). Same columns and ordering-key predicate as
-- claim_lease_queue.sql.
--
-- In one autocommit statement: lock free slot rows (FOR UPDATE SKIP LOCKED,
-- `lease_token IS NULL` re-checked on the newest row version), claim at most
-- as many jobs as slots, move them into pgwake.leased_jobs, and write each
-- new claim token into one of the slots. The slot is freed only by the
-- trigger on pgwake.leased_jobs when that lease row is deleted (done,
-- retry, bury, rescue, cancel), matching by token: a token is never reused,
-- so a second release matches nothing. Rows above max_running (a lowered
-- limit) block new claims until they are gone; the free ones are deleted
-- here (`excess`). Jobs of the queue running without a slot (claimed
-- before the limit was set: `unslotted`, migration 0015) count against the
-- limit: only slots 1..max_running minus those are used. After the keys:
-- a key to repair and the key where the walk between keys stopped (rows
-- without a job, see pgwake.fair_key_jobs).
WITH settings AS (
    SELECT q.max_running, q.rate_count,
           q.fair_keys OR q.key_limits OR q.key_rate_count IS NOT NULL AS by_key, q.key_limits
    FROM pgwake.queues q
    WHERE q.name = $2::text AND NOT q.paused
      AND (q.max_running IS NOT NULL OR q.rate_count IS NOT NULL OR q.fair_keys OR q.key_limits
           OR q.key_rate_count IS NOT NULL)
),
unslotted AS (
    SELECT pgwake.unslotted_running($2::text) AS n
),
excess AS (
    DELETE FROM pgwake.queue_slots s
    WHERE s.queue = $2::text AND s.slot IN (
        SELECT x.slot FROM pgwake.queue_slots x, settings
        WHERE x.queue = $2::text AND x.slot > settings.max_running AND x.lease_token IS NULL
        FOR UPDATE OF x SKIP LOCKED)
),
free AS (
    SELECT f.slot, row_number() OVER (ORDER BY f.slot) AS n
    FROM (
        SELECT s.slot FROM pgwake.queue_slots s, settings, unslotted
        WHERE s.queue = $2::text AND s.lease_token IS NULL
          AND s.slot <= settings.max_running - unslotted.n
          AND NOT EXISTS (SELECT FROM pgwake.queue_slots x
                          WHERE x.queue = $2::text AND x.slot > settings.max_running)
        ORDER BY s.slot
        LIMIT $1
        FOR UPDATE OF s SKIP LOCKED
    ) f
),
-- As many as free slots (no max_running: $1) and admissions ($7). None
-- when the queue has a rate limit but the worker reserved no admissions (it
-- has not seen the limit yet), is paused, or has no limit any more (the
-- worker re-reads which queues are limited).
wanted AS (
    SELECT coalesce((SELECT least(coalesce($7::int8,
                                          CASE WHEN st.rate_count IS NULL THEN $1::int8 ELSE 0 END),
                                 CASE WHEN st.max_running IS NULL THEN $1::int8
                                      ELSE (SELECT count(*) FROM free) END)
                    FROM settings st), 0) AS n
),
-- A fair-keys queue, or one with per-key limits or a per-key rate (at most
-- as many jobs of a key as its admissions in $9): in rotation between its
-- limit keys, after the last key this worker served ($8), each job with the
-- key slot it holds, if any (functions/claims.sql).
picks AS (
    SELECT p.id, p.key_slot, p.repair_key, p.stop_key
    FROM settings st, LATERAL pgwake.fair_key_jobs($2::text, $8::text, (SELECT n FROM wanted),
                                                   $3::text[], $4::text[], $9::text[]) p
    WHERE st.by_key
),
c AS (
    DELETE FROM pgwake.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgwake.jobs
        WHERE queue = $2::text AND run_at <= now()
          AND ($3::text[] IS NULL OR task = ANY($3::text[])) AND task <> ALL($4::text[])
          -- CASE, not `ordering_key IS NULL OR …`, which the planner rates at
          -- 0.5% without statistics (ARCHITECTURE.md, "The claim predicate").
          AND NOT held
          AND CASE WHEN ordering_key IS NULL THEN true
                   ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
          AND NOT (SELECT st.by_key FROM settings st)
        ORDER BY priority, run_at, id
        LIMIT (SELECT n FROM wanted)
        FOR UPDATE SKIP LOCKED)
        || ARRAY(SELECT id FROM picks WHERE id IS NOT NULL))
    RETURNING *
),
l AS (
    INSERT INTO pgwake.leased_jobs
        (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error,
         created_at, timeout, worker_id, leased_at, lease_until, ordering_key, unique_key,
         ordering_at, holds_slot, limit_key, holds_key_slot, suspect, released_at)
    SELECT id, queue, task, payload, priority, run_at, attempts + 1, max_attempts, last_error,
           created_at, timeout, $5, now(), now() + make_interval(secs => $6), ordering_key,
           unique_key, ordering_at,
           -- a slot is held only under a max_running limit (a queue with a
           -- rate limit alone has none): unslotted jobs count as above
           (SELECT st.max_running IS NOT NULL FROM settings st), limit_key,
           EXISTS (SELECT FROM picks p WHERE p.id = c.id AND p.key_slot IS NOT NULL),
           -- for free slots only: never buffered (migration 0024)
           suspect, released_at
    FROM c
    RETURNING *
),
held AS (
    UPDATE pgwake.queue_slots s SET lease_token = t.token
    FROM (SELECT token, row_number() OVER (ORDER BY token) AS n FROM l) t
    JOIN free f ON f.n = t.n
    WHERE s.queue = $2::text AND s.slot = f.slot
),
-- Each lease's key slot carries its token until the lease ends (the
-- trigger leased_jobs_release_key_slot frees it).
key_held AS (
    UPDATE pgwake.key_slots k SET lease_token = l.token
    FROM l JOIN picks p ON p.id = l.id
    WHERE k.queue = $2::text AND k.limit_key = l.limit_key AND k.slot = p.key_slot
)
SELECT id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
       created_at, extract(epoch FROM timeout)::float8,
       extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8,
       token,
       ordering_key, unique_key, coalesce(ordering_at, run_at), limit_key, suspect,
       NULL::text, NULL::text,
       -- a flow's child released by its parents (migration 0045)
       CASE WHEN released_at IS NOT NULL
            THEN extract(epoch FROM clock_timestamp() - greatest(released_at, run_at))::float8
       END AS release_s
FROM l
-- After the limit key, whether the job is a suspect (migration 0024). A key
-- pgwake.fair_key_jobs reported with rows missing: a row without a job, its
-- key in the column after that (the worker repairs the key's rows); or the
-- key where its walk stopped, at the bound of keys passed over, in the
-- column after that (the worker's rotation resumes after it); the last
-- column, release_s, is NULL in these rows.
UNION ALL
SELECT NULL, $2::text, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL, p.repair_key, p.stop_key, NULL
FROM picks p
WHERE p.repair_key IS NOT NULL OR p.stop_key IS NOT NULL
