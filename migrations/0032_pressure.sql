-- pgwake schema, version 32: the governor (issue 35, item 2).
-- `pgwake.pressure()` (functions/pressure.sql) measures the database
-- pressure the queue suffers from and creates (the vacuum horizon's age and
-- holder, the queue tables' dead tuples, the NOTIFY queue), turns it into a
-- level with hysteresis, records each change, and pauses the queues marked
-- `shed_under_pressure` while the level is critical.
--
-- Three singleton or small tables, never touched by claims or producers:
--
--   pressure_settings  the thresholds (one row; pgwake.set_pressure_thresholds)
--   pressure_state     the current level, since when, and its causes (one
--                      row, written only when the level changes)
--   pressure_log       one row per change (kept a day)
--
-- and two columns of pgwake.queues: `shed_under_pressure` (the operator's
-- setting) and `paused_by` ('pressure' while the governor holds the queue
-- paused; NULL for an operator's pause).
--
-- Cost of this migration: new tables, and two columns with constant
-- defaults on pgwake.queues (no rewrite) under a brief lock of that small
-- table. IF NOT EXISTS throughout: applying it again changes nothing (a
-- test that winds the recorded version back replays it). Numbers 30 and 31
-- belong to other branches.

CREATE TABLE IF NOT EXISTS pgwake.pressure_settings (
    singleton                boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Age of the oldest transaction or snapshot holding the horizon, seconds.
    horizon_elevated_seconds float8 NOT NULL DEFAULT 60,
    horizon_critical_seconds float8 NOT NULL DEFAULT 300,
    -- Dead tuples of the queue tables (jobs, leased_jobs, tx_batches), summed.
    dead_tuples_elevated     bigint NOT NULL DEFAULT 100000,
    dead_tuples_critical     bigint NOT NULL DEFAULT 1000000,
    -- pg_notification_queue_usage(), a fraction of the NOTIFY queue.
    notify_elevated          float8 NOT NULL DEFAULT 0.25,
    notify_critical          float8 NOT NULL DEFAULT 0.5,
    -- A level is left only when its measure falls below threshold × ratio.
    leave_ratio              float8 NOT NULL DEFAULT 0.5,
    CONSTRAINT pressure_settings_horizon
        CHECK (horizon_elevated_seconds > 0 AND horizon_elevated_seconds < horizon_critical_seconds
               AND horizon_critical_seconds <= 86400 * 7),
    CONSTRAINT pressure_settings_dead_tuples
        CHECK (dead_tuples_elevated > 0 AND dead_tuples_elevated < dead_tuples_critical),
    CONSTRAINT pressure_settings_notify
        CHECK (notify_elevated > 0 AND notify_elevated < notify_critical AND notify_critical <= 1),
    CONSTRAINT pressure_settings_leave_ratio
        CHECK (leave_ratio > 0 AND leave_ratio < 1)
);
INSERT INTO pgwake.pressure_settings DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS pgwake.pressure_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    level     text NOT NULL DEFAULT 'ok' CHECK (level IN ('ok', 'elevated', 'critical')),
    since     timestamptz NOT NULL DEFAULT now(),
    causes    jsonb NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(causes) = 'array')
);
INSERT INTO pgwake.pressure_state DEFAULT VALUES ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS pgwake.pressure_log (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT now(),
    level    text NOT NULL CHECK (level IN ('ok', 'elevated', 'critical')),
    previous text NOT NULL CHECK (previous IN ('ok', 'elevated', 'critical')),
    causes   jsonb NOT NULL CHECK (jsonb_typeof(causes) = 'array'),
    -- {"paused": [queues], "resumed": [queues]}: what shedding did.
    actions  jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS pressure_log_at ON pgwake.pressure_log (at);

ALTER TABLE pgwake.queues
    ADD COLUMN IF NOT EXISTS shed_under_pressure boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS paused_by text
        CONSTRAINT queues_paused_by CHECK (paused_by IS NULL OR (paused_by = 'pressure' AND paused));
