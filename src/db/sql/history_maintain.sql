-- History maintenance under the advisory lock: partitions ahead, expired
-- partitions dropped (migration 0006). $1: seconds to keep, $2: days
-- ahead, $3: most milliseconds a CREATE/DROP waits for its lock.
SELECT created, dropped, rows_dropped, failed
FROM pgwake.history_maintain(make_interval(secs => $1::float8), $2::int,
                             make_interval(secs => $3::float8 / 1000))
