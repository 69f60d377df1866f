-- `pgwake run --keep-finished`: set (or, with NULL, turn off) the history
-- for every worker of this database.
UPDATE pgwake.history_settings
SET keep = make_interval(secs => $1::float8), changed_at = now()
WHERE keep IS DISTINCT FROM make_interval(secs => $1::float8)
