-- The age in seconds of this database's oldest open transaction (the
-- oldest_tx_age of sample_pressure.sql, alone): read by the sampler once a
-- second between its samples (services/sampler.rs, HORIZON_PROBE_EVERY),
-- so that claims resume after their cursor (claim/choose/cursor.rs) within about a
-- second of a transaction holding the horizon long enough (health.rs,
-- horizon_held: 5 s, or from 1 s at a high claim rate) rather than up to
-- a sample interval later. One row per backend, no table read.
SELECT greatest(0, coalesce(extract(epoch FROM max(now() - xact_start)), 0))::float8
FROM pg_stat_activity
WHERE datname = current_database()
  AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
  AND backend_type = 'client backend'
