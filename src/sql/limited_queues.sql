-- The queues with a max_running limit (migration 0009): a worker claims
-- them with claim_*_limited.sql (the other claim statements skip them).
SELECT name FROM pgwake.queues WHERE max_running IS NOT NULL
