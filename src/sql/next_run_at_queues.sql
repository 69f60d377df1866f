-- The earliest future run_at among the worker's queues.
SELECT min(run_at) FROM pgwake.jobs WHERE run_at > now() AND queue = ANY($1::text[])
