-- `pgwake queue set Q --rate-per-key N/W | --no-rate-per-key`: $1 the queue,
-- $2 at most this many admissions per window of any one limit key (NULL: no
-- per-key rate), $3 the window in seconds. See functions/queues.sql.
SELECT pgwake.set_queue_rate_per_key($1::text, $2::int, make_interval(secs => $3::float8))
