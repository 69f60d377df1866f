-- pgwake schema, version 33: the per-minute rollup (issue 38, item 2).
-- "What ran?" without full history: each worker counts its outcomes in
-- memory (per queue, task and outcome, with the pickup latency's sum and
-- maximum) and adds them here with one upsert every few seconds
-- (src/services/rollup.rs); several workers add into the same rows. The
-- sampler records each queue's depth once per sample into minute_depth.
-- Both are pruned by the rollup service after `--stats-retention` (48 h by
-- default). Never touched by claims or producers.
--
-- Cost of this migration: two new, empty tables. IF NOT EXISTS throughout:
-- applying it again changes nothing.

CREATE TABLE IF NOT EXISTS pgwake.minute_stats (
    -- The minute the outcomes were counted in (the worker's clock).
    minute             timestamptz NOT NULL,
    queue              text NOT NULL,
    task               text NOT NULL,
    -- done, retry, dead or cancelled (Resolution::label).
    outcome            text NOT NULL,
    jobs               bigint NOT NULL,
    -- Pickup latency of these runs (seconds ready before the claim).
    pickup_seconds_sum float8 NOT NULL DEFAULT 0,
    pickup_seconds_max float8 NOT NULL DEFAULT 0,
    PRIMARY KEY (minute, queue, task, outcome)
);

CREATE TABLE IF NOT EXISTS pgwake.minute_depth (
    minute    timestamptz NOT NULL,
    queue     text NOT NULL,
    -- Ready and scheduled jobs at the minute's last sample (capped counts,
    -- as the depth gauges).
    ready     bigint NOT NULL,
    scheduled bigint NOT NULL,
    PRIMARY KEY (minute, queue)
);
