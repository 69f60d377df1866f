-- As next_run_at_all.sql, among the worker's queues.
SELECT extract(epoch FROM min(run_at) - now())::float8,
       extract(epoch FROM now())::float8
FROM pgwake.jobs WHERE run_at > now() AND queue = ANY($1::text[])
