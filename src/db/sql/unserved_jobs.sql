-- Ready jobs no live worker can run, at the heads of their queues
-- (functions/workers.sql): $1 jobs per queue and priority, $2 pairs at most;
-- the age of the oldest of each in seconds.
SELECT queue, task, jobs, greatest(0, extract(epoch FROM now() - oldest))::float8
FROM pgwake.unserved_jobs($1, $2)
