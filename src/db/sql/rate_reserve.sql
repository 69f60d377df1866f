-- Admissions for a rate-limited queue (migration 0010), taken in their own
-- autocommit statement just before a claim. $1: the queue (NULL: the queue
-- of job $3, for the one-job claim of a suspect), $2: most admissions
-- wanted.
--
-- Takes up to $2 slots whose last admission is at least a window old (the
-- oldest first), never
-- more than the queue has ready jobs (so a short queue does not take
-- admissions it cannot use), and stamps them with this statement's now():
-- from then on they admit nothing for one window. FOR UPDATE SKIP LOCKED
-- re-checks `last_start` on the newest row version, so two concurrent
-- reservations never take one slot.
--
-- Returns: the queue, whether it has a rate limit (false: claim without one),
-- the slots taken, their admission time, how many ready jobs were seen, and
-- when the next slot frees (NULL when every slot wanted was taken).
WITH target AS (
    SELECT coalesce($1::text, (SELECT queue FROM pgwake.jobs WHERE id = $3::int8)) AS name
),
q AS (
    SELECT q.name, q.rate_count, q.rate_window, q.paused
    FROM pgwake.queues q JOIN target t ON q.name = t.name
    WHERE q.rate_count IS NOT NULL
),
ready AS (
    SELECT count(*) AS n FROM (
        SELECT FROM pgwake.jobs j, q
        WHERE j.queue = q.name AND j.run_at <= now() AND NOT q.paused
          AND ($3::int8 IS NULL OR j.id = $3::int8)
        LIMIT $2::int8) r
),
free AS (
    -- Oldest admissions first, on queue_rate_slots_oldest_idx: the scan
    -- stops after the slots it takes, or at the first admission younger
    -- than a window. Scalar subqueries (not a join with q) keep the plan an
    -- ordered index scan, whatever the number of slots.
    SELECT s.slot FROM pgwake.queue_rate_slots s
    WHERE s.queue = (SELECT name FROM q)
      AND s.last_start <= now() - (SELECT rate_window FROM q)
      AND s.slot <= (SELECT rate_count FROM q)
    ORDER BY s.last_start
    LIMIT (SELECT n FROM ready)
    FOR UPDATE OF s SKIP LOCKED
),
taken AS (
    UPDATE pgwake.queue_rate_slots s SET prev_start = s.last_start, last_start = now()
    WHERE s.queue = (SELECT name FROM q) AND s.slot = ANY(ARRAY(SELECT slot FROM free))
    RETURNING s.slot
)
SELECT (SELECT name FROM target) AS queue,
       EXISTS (SELECT FROM q) AS limited,
       ARRAY(SELECT slot FROM taken ORDER BY slot) AS slots,
       now() AS admitted_at,
       (SELECT n FROM ready) AS ready,
       CASE WHEN (SELECT count(*) FROM taken) < (SELECT n FROM ready) THEN
           -- The slots not taken now hold admissions younger than a window
           -- (or another reservation has them locked this instant).
           coalesce((SELECT min(s.last_start) + (SELECT rate_window FROM q)
                     FROM pgwake.queue_rate_slots s
                     WHERE s.queue = (SELECT name FROM q)
                       AND s.last_start > now() - (SELECT rate_window FROM q)
                       AND s.slot <= (SELECT rate_count FROM q)),
                    now() + (SELECT rate_window FROM q))
       END AS next_free
