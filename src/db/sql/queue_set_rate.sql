-- `pgwake queue set Q --rate N/W | --no-rate`: $1 the queue, $2 at most
-- this many admissions per window (NULL: no rate limit), $3 the window in
-- seconds. See functions/queues.sql.
SELECT pgwake.set_queue_rate($1::text, $2::int, make_interval(secs => $3::float8))
