-- `pgwake stats`: per queue, the waiting jobs their handler snoozed (their
-- run_at is the one their last snooze gave them, migration 0034), and the
-- most snoozes one of them has. Reads pgwake.job_snoozes, which holds only
-- jobs that ever snoozed, each looked up by id.
SELECT j.queue, count(*)::int8, max(s.snoozes)::int4
FROM pgwake.job_snoozes s
JOIN pgwake.jobs j ON j.id = s.job_id
WHERE j.run_at = s.snoozed_until AND j.run_at > now()
GROUP BY j.queue
