-- Taken right after a registration commits: the transactions in progress
-- now may have run the insert trigger before they could see it.
SELECT pg_current_snapshot()::text
