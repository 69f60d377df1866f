-- pgwake schema, version 4: recurring jobs. One row per schedule; every
-- worker's scheduler claims due rows with FOR UPDATE SKIP LOCKED, enqueues
-- the tick's job(s) and advances next_tick in the same transaction, so each
-- tick is enqueued exactly once however many workers run (ARCHITECTURE.md).
-- Definitions go through pgwake.schedule_add() (triggers/schedules.sql).
CREATE TABLE pgwake.schedules (
    name             text        PRIMARY KEY,
    -- 5 fields (minute first) or 6 (second first); evaluated by the worker
    cron             text        NOT NULL,
    -- IANA zone the expression is read in
    tz               text        NOT NULL DEFAULT 'UTC',
    task             text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}'::jsonb,
    queue            text        NOT NULL DEFAULT 'default',
    priority         integer     NOT NULL DEFAULT 0,
    -- missed ticks enqueued after downtime besides the latest due one;
    -- 0 is `skip`
    catch_up         integer     NOT NULL DEFAULT 0,
    -- The first tick not yet served. While `fresh` (just added or
    -- redefined, no worker has seen it yet) it is instead the instant of the
    -- definition, and the first tick is the first one after it.
    next_tick        timestamptz NOT NULL DEFAULT now(),
    fresh            boolean     NOT NULL DEFAULT true,
    -- the newest tick enqueued, and its job (the pile-up check looks for it)
    last_tick        timestamptz,
    last_job_id      bigint,
    -- counters since the schedule was added
    ticks_enqueued   bigint      NOT NULL DEFAULT 0,
    ticks_missed     bigint      NOT NULL DEFAULT 0,
    ticks_waiting    bigint      NOT NULL DEFAULT 0,
    -- set by a worker that cannot evaluate the expression or zone; such a
    -- schedule is not served until it is replaced
    error            text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT schedules_name_valid
        CHECK (name <> '' AND octet_length(name) <= 128 AND name !~ '[[:cntrl:]]'),
    CONSTRAINT schedules_cron_valid CHECK (btrim(cron) <> '' AND octet_length(cron) <= 256),
    CONSTRAINT schedules_task_valid CHECK (task <> '' AND octet_length(task) <= 256),
    CONSTRAINT schedules_queue_valid CHECK (queue <> '' AND octet_length(queue) <= 128),
    CONSTRAINT schedules_catch_up_valid CHECK (catch_up BETWEEN 0 AND 1000),
    CONSTRAINT schedules_counters_valid
        CHECK (ticks_enqueued >= 0 AND ticks_missed >= 0 AND ticks_waiting >= 0)
) WITH (
    -- every served tick updates its row; keep the table and its index tight
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000
);

-- The schedulers' "what is due" and "when is the next tick" lookups.
CREATE INDEX schedules_due_idx ON pgwake.schedules (next_tick) WHERE error IS NULL;
