-- Job $1's snoozes (migration 0034): how many, until when the last one
-- put it back, and when it was taken. No row: it never snoozed.
SELECT snoozes, snoozed_until, snoozed_at FROM pgwake.job_snoozes WHERE job_id = $1
