-- tx-mode claim of one suspect job by id ($1), to run it alone (see
-- tx_attempts in migrations/0005). Same columns and ordering-key
-- predicate as claim_tx_all.sql.
WITH c AS (
    DELETE FROM pgwake.jobs
    WHERE id = ANY(ARRAY(
        SELECT id FROM pgwake.jobs
        WHERE id = $1 AND run_at <= now()
          AND (ordering_key IS NULL
               OR pgwake.ordering_free(ordering_key, priority, coalesce(ordering_at, run_at), id))
        FOR UPDATE SKIP LOCKED))
    RETURNING *
)
SELECT id, queue, task, payload::text, priority, run_at, attempts, max_attempts, last_error,
       created_at, extract(epoch FROM timeout)::float8,
       extract(epoch FROM clock_timestamp() - greatest(created_at, run_at))::float8,
       pg_current_xact_id()::text,
       pg_backend_pid(),
       ordering_key, unique_key, coalesce(ordering_at, run_at)
FROM c
