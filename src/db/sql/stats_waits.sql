-- `pgwake stats`: per queue, the waiting jobs their handler put to sleep
-- and those waiting for a signal (their run_at is the one their last wait
-- gave it, migrations 0041 and 0042). Reads pgwake.job_waits, which holds
-- only jobs that ever waited, each looked up by id.
SELECT j.queue,
       count(*) FILTER (WHERE w.kind = 'sleep')::int8,
       count(*) FILTER (WHERE w.kind = 'signal' AND w.signal_state = 'waiting')::int8
FROM pgwake.job_waits w
JOIN pgwake.jobs j ON j.id = w.job_id
WHERE j.run_at = w.wait_until AND j.run_at > now()
GROUP BY j.queue
