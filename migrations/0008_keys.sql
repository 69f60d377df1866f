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
-- All three travel with the job: leased_jobs, dead_jobs.

ALTER TABLE pgwake.jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.jobs ADD COLUMN unique_key text;
ALTER TABLE pgwake.jobs ADD COLUMN ordering_at timestamptz;
ALTER TABLE pgwake.leased_jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.leased_jobs ADD COLUMN unique_key text;
ALTER TABLE pgwake.leased_jobs ADD COLUMN ordering_at timestamptz;
ALTER TABLE pgwake.dead_jobs ADD COLUMN ordering_key text;
ALTER TABLE pgwake.dead_jobs ADD COLUMN unique_key text;
ALTER TABLE pgwake.dead_jobs ADD COLUMN ordering_at timestamptz;

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
