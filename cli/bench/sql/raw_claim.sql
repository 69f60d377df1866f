-- Bench: the raw-SQL ceiling. The textbook claim, nothing else: delete up to
-- $1 ready jobs of queue $2 in claim order, skipping locked rows, and return
-- them. Run in autocommit, it is what a bare loop of this statement drains.
DELETE FROM pgwake.jobs
WHERE id = ANY(ARRAY(
    SELECT id FROM pgwake.jobs
    WHERE queue = $2 AND run_at <= now()
    ORDER BY priority, run_at, id
    LIMIT $1
    FOR UPDATE SKIP LOCKED))
RETURNING id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
          created_at
