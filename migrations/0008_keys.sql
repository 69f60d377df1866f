-- pgwake schema, version 8: ordered keys and unique jobs (issue 10).
--
-- * `ordering_key`: jobs with the same key run one at a time, in the order
--   (priority, ordering_at, id) fixed at enqueue. `ordering_at` is the
--   job's run_at as enqueued (NULL: its run_at, which has not changed yet);
--   every path that changes run_at (a retry, a rescue, `dead retry`) sets
--   it first, so a failed job keeps its place in its key.
-- * `unique_key`: at most one waiting job (in pgwake.jobs) per key, by a
--   partial unique index. A plain INSERT of a duplicate fails with
--   unique_violation on `jobs_unique_key`; pgwake.enqueue_unique() (and the
--   CLI, NDJSON, Rust client, pgwake.enqueue) returns the existing id.
-- All three travel with the job: leased_jobs, dead_jobs; the two keys are
-- recorded in the history (finished_jobs).

ALTER TABLE pgwake.jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.jobs ADD COLUMN unique_key text;
ALTER TABLE pgwake.jobs ADD COLUMN ordering_at timestamptz;
ALTER TABLE pgwake.leased_jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.leased_jobs ADD COLUMN unique_key text;
ALTER TABLE pgwake.leased_jobs ADD COLUMN ordering_at timestamptz;
ALTER TABLE pgwake.dead_jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.dead_jobs ADD COLUMN unique_key text;
ALTER TABLE pgwake.dead_jobs ADD COLUMN ordering_at timestamptz;
ALTER TABLE pgwake.finished_jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.finished_jobs ADD COLUMN unique_key text;

-- A key's jobs in their order: the claim's "is this job its key's head"
-- probe. Partial: jobs without a key are not in it and cost nothing.
CREATE INDEX jobs_ordering_idx ON pgwake.jobs
    (ordering_key, priority, (coalesce(ordering_at, run_at)), id)
    WHERE ordering_key IS NOT NULL;
-- "Is a job of this key running (leased)?"
CREATE INDEX leased_jobs_ordering_idx ON pgwake.leased_jobs (ordering_key)
    WHERE ordering_key IS NOT NULL;
-- At most one waiting job per unique key.
CREATE UNIQUE INDEX jobs_unique_key ON pgwake.jobs (unique_key)
    WHERE unique_key IS NOT NULL;

-- pgwake.enqueue() gains `ordering_key` and `unique_key`
-- (triggers/enqueue.sql); the old seven-argument version would make calls
-- ambiguous. (Checked first: DROP … IF EXISTS would print a NOTICE.)
DO $$
BEGIN
    IF to_regprocedure('pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval)') IS NOT NULL THEN
        DROP FUNCTION pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval);
    END IF;
END
$$;

-- Dead and cancelled jobs into the history (migration 0006), now with
-- their keys.
CREATE OR REPLACE FUNCTION pgwake.record_dead() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgwake.history_settings WHERE keep IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pgwake.finished_jobs
            (id, queue, task, payload, outcome, error, attempts, enqueued_at, started_at,
             finished_at, worker, ordering_key, unique_key)
        SELECT id, queue, task, payload,
               CASE WHEN last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               last_error, attempts, created_at, started_at, clock_timestamp(), worker_id,
               ordering_key, unique_key
        FROM new_rows;
    ELSE
        -- A bury that found the id already dead (ON CONFLICT … DO UPDATE
        -- sets failed_at): a new death. Other updates are not.
        INSERT INTO pgwake.finished_jobs
            (id, queue, task, payload, outcome, error, attempts, enqueued_at, started_at,
             finished_at, worker, ordering_key, unique_key)
        SELECT n.id, n.queue, n.task, n.payload,
               CASE WHEN n.last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               n.last_error, n.attempts, n.created_at, n.started_at, clock_timestamp(), n.worker_id,
               n.ordering_key, n.unique_key
        FROM new_rows n JOIN old_rows o USING (id)
        WHERE n.failed_at IS DISTINCT FROM o.failed_at;
    END IF;
    RETURN NULL;
END
$$;
