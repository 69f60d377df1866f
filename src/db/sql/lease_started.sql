-- Buffered lease-mode jobs that started (issue 33, item 2): the claim put
-- them in a worker's prefetch buffer (`leased_jobs.buffered`, migration
-- 0024); from now on they show as running, and a crash of their worker
-- charges them. Sent by the worker, coalesced, committed asynchronously
-- (a lost mark only leaves a started job refunded on a crash, never
-- charged without a run). $1: claim tokens.
UPDATE pgwake.leased_jobs SET buffered = false WHERE token = ANY($1::bigint[]) AND buffered
