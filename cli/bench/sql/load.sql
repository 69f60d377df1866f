-- Bench: load $1 no-op jobs of task $3 on queue $2 in one statement. With
-- $4, every second job (interleaved by id) is scheduled an hour ahead, so
-- half the backlog waits in the future.
INSERT INTO pgwake.jobs (queue, task, run_at)
SELECT $2, $3,
       CASE WHEN $4 AND g % 2 = 0 THEN now() + interval '1 hour' ELSE now() END
FROM generate_series(1, $1::bigint) AS g
