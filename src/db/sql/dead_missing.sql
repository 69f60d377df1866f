-- Which of the given ids name no dead job (of queue $2, if given).
-- $1: ids, $2: queue (NULL: any).
SELECT i
FROM unnest($1::bigint[]) AS i
WHERE NOT EXISTS (
    SELECT 1 FROM pgwake.dead_jobs d
    WHERE d.id = i AND ($2::text IS NULL OR d.queue = $2)
)
ORDER BY i
