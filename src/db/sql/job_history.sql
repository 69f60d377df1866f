-- Job $1's history rows (history on), oldest first, results pretty-printed.
SELECT outcome, attempts, started_at, finished_at, worker, error, jsonb_pretty(result)
FROM pgwake.finished_jobs WHERE id = $1
ORDER BY finished_at
