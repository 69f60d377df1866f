-- tx-mode claim of one suspect job by id ($1), to run it alone (see
-- tx_attempts in migrations/0005). Same columns and ordering-key
-- predicate as claim_tx_all.sql.
--
-- Queue settings (migrations 0009, 0010) hold here too: nothing is claimed
-- from a paused queue, a job of a queue with max_running takes a free slot
-- (locked until this transaction ends, as in claim_tx_limited.sql) or is
-- not claimed now, and a job of a rate-limited queue is claimed only with
-- an admission the worker reserved for it ($2, src/db/sql/rate_reserve.sql),
-- and a keyed job of a queue with a per-key rate only with an admission of
-- its key ($3, pgwake.reserve_key_admissions).
--
-- The last two columns say whether the job took a queue slot and a key
-- slot: one run without them is named in a mark of its own
-- (claim/tx/ledger.rs), so that a limit set while it runs counts it.
WITH j AS (
    SELECT queue, limit_key FROM pgwake.jobs WHERE id = $1
),
settings AS (
    SELECT q.paused, q.max_running, q.rate_count, q.key_limits, q.max_running_per_key,
           q.key_rate_count
    FROM pgwake.queues q JOIN j ON q.name = j.queue
),
-- The job's key's limit, under per-key limits (migration 0020), and a free
-- slot of its key (pgwake.key_slots, as pgwake.fair_key_jobs takes one,
-- counting the key's jobs that run without a slot): a job run alone keeps
-- to its key's limit too.
key_limit AS (
    SELECT coalesce((SELECT l.max_running FROM pgwake.queue_key_limits l
                     WHERE l.queue = j.queue AND l.limit_key = j.limit_key),
                    st.max_running_per_key) AS lim
    FROM j, settings st
    WHERE st.key_limits AND j.limit_key IS NOT NULL
),
key_slot AS (
    SELECT y.slot FROM pgwake.key_slots y
    JOIN j ON y.queue = j.queue AND y.limit_key = j.limit_key
    JOIN key_limit kl ON y.slot <= kl.lim
    WHERE y.lease_token IS NULL
      -- the key's jobs running without a slot count (migration 0022)
      AND y.slot <= kl.lim - pgwake.unslotted_key_running(j.queue, j.limit_key)
      AND NOT EXISTS (SELECT FROM pgwake.key_slots x
                      WHERE x.queue = j.queue AND x.limit_key = j.limit_key AND x.slot > kl.lim)
    ORDER BY y.slot
    LIMIT 1
    FOR UPDATE OF y SKIP LOCKED
),
slot AS (
    SELECT s.slot FROM pgwake.queue_slots s
    JOIN j ON s.queue = j.queue
    JOIN settings st ON s.slot <= st.max_running
    WHERE s.lease_token IS NULL
      AND NOT EXISTS (SELECT FROM pgwake.queue_slots x
                      WHERE x.queue = j.queue AND x.slot > st.max_running)
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s SKIP LOCKED
),
c AS (
    DELETE FROM pgwake.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgwake.jobs
        WHERE id = $1 AND run_at <= now()
          -- CASE, not `ordering_key IS NULL OR …`, which the planner rates at
          -- 0.5% without statistics (ARCHITECTURE.md, "The claim predicate").
          AND NOT held
          AND CASE WHEN ordering_key IS NULL THEN true
                   ELSE pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id) END
          AND NOT EXISTS (SELECT FROM settings WHERE paused)
          AND (NOT EXISTS (SELECT FROM settings WHERE max_running IS NOT NULL)
               OR EXISTS (SELECT FROM slot))
          AND (NOT EXISTS (SELECT FROM settings WHERE rate_count IS NOT NULL) OR $2::bool)
          AND (NOT EXISTS (SELECT FROM settings, j
                           WHERE settings.key_rate_count IS NOT NULL AND j.limit_key IS NOT NULL)
               OR $3::bool)
          AND (NOT EXISTS (SELECT FROM key_limit WHERE lim IS NOT NULL)
               OR EXISTS (SELECT FROM key_slot))
        FOR UPDATE SKIP LOCKED))
    RETURNING *
)
SELECT id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
       created_at, extract(epoch FROM timeout)::float8,
       extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8,
       pg_current_xact_id()::text,
       pg_backend_pid(),
       ordering_key, unique_key, coalesce(ordering_at, run_at), limit_key,
       EXISTS (SELECT FROM slot), EXISTS (SELECT FROM key_slot),
       -- a flow's child released by its parents (migration 0045)
       CASE WHEN released_at IS NOT NULL
            THEN extract(epoch FROM clock_timestamp() - greatest(released_at, run_at))::float8
       END AS release_s
FROM c
