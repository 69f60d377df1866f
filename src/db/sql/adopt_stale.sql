-- Batches whose claim transaction is over but whose marker is still here
-- never reported: the worker crashed, or its connection or the server died,
-- while one of their jobs ran. In a batch of one job that job was running:
-- it is charged now. In a larger batch which job it was is unknown, so each
-- becomes a suspect that runs alone next time, charged before it starts.
-- Returns how many markers were adopted.
WITH stale AS (
    DELETE FROM pgwake.tx_batches
    WHERE pg_xact_status(xid) IS DISTINCT FROM 'in progress'
    RETURNING job_ids
),
suspects AS (
    INSERT INTO pgwake.tx_attempts (job_id, charged)
    SELECT j, max(CASE WHEN cardinality(s.job_ids) = 1 THEN 1 ELSE 0 END)
    FROM stale s, unnest(s.job_ids) AS j
    GROUP BY j
    ON CONFLICT (job_id) DO UPDATE SET charged = pgwake.tx_attempts.charged + excluded.charged
)
SELECT count(*) FROM stale
