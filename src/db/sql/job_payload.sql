-- Job $1's payload, pretty-printed by the server (numbers exactly as
-- stored), wherever the job is: waiting, running, dead, or finished.
SELECT jsonb_pretty(p) FROM (
    SELECT payload AS p FROM pgwake.jobs WHERE id = $1
    UNION ALL SELECT payload FROM pgwake.leased_jobs WHERE id = $1
    UNION ALL SELECT payload FROM pgwake.dead_jobs WHERE id = $1
    UNION ALL (SELECT payload FROM pgwake.finished_jobs WHERE id = $1
               ORDER BY finished_at DESC LIMIT 1)
) found
LIMIT 1
