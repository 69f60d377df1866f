-- The earliest future run_at over every queue: when the poller must wake next.
SELECT min(run_at) FROM pgwake.jobs WHERE run_at > now()
