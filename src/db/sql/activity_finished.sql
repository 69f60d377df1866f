-- Jobs finished per queue in the last $1 seconds, from the history
-- (pgwake.finished_jobs, when history is on): a range of
-- finished_jobs_finished_at_idx in the newest partition, never the whole
-- history.
SELECT queue, count(*)::int8
FROM pgwake.finished_jobs
WHERE finished_at > now() - make_interval(secs => $1)
GROUP BY queue
ORDER BY queue
