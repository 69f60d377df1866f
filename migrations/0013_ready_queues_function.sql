-- pgwake schema, version 13: the fair claims' read of the ready queues
-- (src/fair.rs, every 16 claim rounds and after an empty one) runs in a
-- PL/pgSQL function that plans its query once per session, as the plain
-- claims do since version 12.
--
-- Why. As a prepared statement with custom plans it was planned on every
-- call: about half of its ~1 ms of server time (pg_stat_statements during
-- the tx burn-down at batch 100, where these reads were about a tenth of
-- the claim statements' server time).
--
-- A plan made once must be right whatever the table held when it was made
-- (migration 0012 says why and how). Here:
--   * The distinct queues come from a loose scan: each step is the first
--     queue after the last one, `ORDER BY queue LIMIT 1`. With sorting and
--     sequential scans off, only an index that starts with `queue` gives
--     that order: jobs_queue_claim_idx.
--   * Whether a queue has a ready job: its first ready row in the index's
--     full order, `queue >= q AND queue <= q AND run_at <= now() ORDER BY
--     queue, priority, run_at, id LIMIT 1`. A scalar subquery, not EXISTS:
--     an EXISTS drops its ORDER BY, which leaves the choice of index to
--     costs, and on an empty table jobs_claim_idx and jobs_run_at_idx
--     (which read every other queue's jobs too) cost about what the
--     queue's own range does. (In tests/plans.rs the EXISTS form chose the
--     range too; the order makes it the only choice.)
--   * `jit = off`: a disabled plan type's cost would put the plan above
--     `jit_above_cost`.
-- tests/plans.rs checks the plan, made on an empty table and after a burst.

-- The queues that have a ready job, but those in `skip_queues` and paused
-- ones, at most `max_queues`, in name order.
CREATE FUNCTION pgwake.ready_queues(skip_queues text[], max_queues bigint)
RETURNS TABLE (queue text)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET enable_sort = off
SET enable_seqscan = off
SET jit = off
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH RECURSIVE qs AS (
        (SELECT j.queue FROM pgwake.jobs j ORDER BY j.queue LIMIT 1)
        UNION ALL
        SELECT (SELECT j.queue FROM pgwake.jobs j WHERE j.queue > qs.queue
                ORDER BY j.queue LIMIT 1)
        FROM qs
        WHERE qs.queue IS NOT NULL
    )
    SELECT qs.queue
    FROM qs
    WHERE qs.queue IS NOT NULL
      AND qs.queue <> ALL(skip_queues)
      AND qs.queue <> ALL(ARRAY(SELECT q.name FROM pgwake.queues q WHERE q.paused))
      -- The index walks the queue's first priority first: it stops at the
      -- first ready job, and reads past the scheduled ones ahead of it.
      AND (SELECT true FROM pgwake.jobs j
           WHERE j.queue >= qs.queue AND j.queue <= qs.queue AND j.run_at <= now()
           ORDER BY j.queue, j.priority, j.run_at, j.id
           LIMIT 1)
    LIMIT max_queues;
END
$$;
