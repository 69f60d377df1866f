-- `pgwake run --keep-finished`: set (or, with NULL, turn off) the history
-- for every worker of this database. An upsert: the one row may have been
-- deleted by hand.
INSERT INTO pgwake.history_settings AS s (keep, changed_at)
VALUES (make_interval(secs => $1::float8), now())
ON CONFLICT (singleton) DO UPDATE SET keep = excluded.keep, changed_at = excluded.changed_at
WHERE s.keep IS DISTINCT FROM excluded.keep
