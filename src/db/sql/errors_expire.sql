-- Attempt errors older than seven days go (migration 0019), at most 10,000 a
-- rescue round: a range of job_errors_at_idx.
DELETE FROM pgwake.job_errors
WHERE ctid = ANY (ARRAY(SELECT ctid FROM pgwake.job_errors
                        WHERE at < now() - interval '7 days' LIMIT 10000))
