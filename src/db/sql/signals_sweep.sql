-- A kept signal (migration 0042) whose key has a job waiting for it — a
-- lease-mode worker gone between writing the wait and taking the kept
-- signal, a tx-mode claim of a timed-out waiter rolled back — is
-- delivered now, at most 100 keys a rescue round.
SELECT pgwake.take_kept_signals(ARRAY(
    SELECT DISTINCT s.key FROM pgwake.signals s
    JOIN pgwake.job_waits w ON w.signal_key = s.key AND w.signal_state = 'waiting'
    JOIN pgwake.jobs j ON j.id = w.job_id AND j.run_at = w.wait_until
    WHERE s.keep_until > now()
    LIMIT 100))
