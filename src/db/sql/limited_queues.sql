-- The queues with a max_running limit (migration 0009), a rate limit
-- (migration 0010), fair keys or per-key limits (migration 0020) or a
-- per-key rate (migration 0021): a worker claims them with
-- claim_*_limited.sql (the other claim statements skip them), reserving
-- admissions first for those with a rate limit (`rated`) or a per-key rate
-- (`key_rated`).
SELECT name, rate_count IS NOT NULL AS rated, key_rate_count IS NOT NULL AS key_rated
FROM pgwake.queues WHERE max_running IS NOT NULL OR rate_count IS NOT NULL OR fair_keys
   OR key_limits OR key_rate_count IS NOT NULL
