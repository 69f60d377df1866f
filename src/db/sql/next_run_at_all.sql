-- When the poller must wake next, over every queue: seconds from the
-- database's now() to the earliest future run_at (NULL: none), and the
-- database's clock (epoch seconds), so that the worker never compares
-- run_at with its own clock.
SELECT extract(epoch FROM min(run_at) - now())::float8,
       extract(epoch FROM now())::float8
FROM pgwake.jobs WHERE run_at > now()
