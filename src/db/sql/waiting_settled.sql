-- Whether every transaction in progress at the snapshot $1 has ended (its
-- inserts, if it committed, are now visible to a claim).
SELECT NOT EXISTS (
    SELECT 1 FROM pg_snapshot_xip($1::text::pg_snapshot) AS x
    WHERE pg_xact_status(x) = 'in progress')
