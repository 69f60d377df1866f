-- pgwake schema, version 6: history and results.
--
-- * `pgwake.history_settings`: one row; `keep` NULL means history is off
--   (the default). `pgwake run --keep-finished DURATION` sets it; every
--   worker reads it at start-up and once a minute.
-- * `pgwake.finished_jobs`: one row per finished run (done, dead,
--   cancelled), range-partitioned by `finished_at`, one partition per UTC
--   day, created ahead and dropped whole by the workers' history
--   maintenance (no row deletes, no bloat). A DEFAULT partition catches
--   rows no daily partition covers, so a history write can never fail for
--   want of a partition.
-- * Done runs are written by the worker in the statement (lease mode) or
--   the transaction (tx mode) that completes them. Dead and cancelled runs
--   are written by a trigger on `pgwake.dead_jobs`, whatever path put them
--   there (tx bury, lease bury, the rescuer, `pgwake.cancel`).
-- * `dead_jobs` gains `worker_id` and `started_at` (nullable; who ran the
--   last attempt and when it was claimed), copied into the history.

CREATE TABLE pgwake.history_settings (
    singleton  boolean     PRIMARY KEY DEFAULT true CONSTRAINT history_settings_singleton CHECK (singleton),
    keep       interval    CONSTRAINT history_settings_keep_valid CHECK (keep IS NULL OR keep > interval '0'),
    changed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO pgwake.history_settings (keep) VALUES (NULL);

CREATE TABLE pgwake.finished_jobs (
    id          bigint      NOT NULL,
    queue       text        NOT NULL,
    task        text        NOT NULL,
    payload     jsonb       NOT NULL,
    outcome     text        NOT NULL
        CONSTRAINT finished_jobs_outcome_valid CHECK (outcome IN ('done', 'dead', 'cancelled')),
    -- done: the handler's result (exec stdout, a sql function's value, a
    -- Rust handler's `Outcome::DoneWith`); NULL when there is none.
    result      jsonb,
    -- dead / cancelled: the last error.
    error       text,
    attempts    integer     NOT NULL,
    enqueued_at timestamptz NOT NULL,
    -- when the finishing run was claimed (database clock)
    started_at  timestamptz,
    finished_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    worker      text
) PARTITION BY RANGE (finished_at);
CREATE INDEX finished_jobs_finished_at_idx ON pgwake.finished_jobs (finished_at);
CREATE INDEX finished_jobs_id_idx ON pgwake.finished_jobs (id);
CREATE TABLE pgwake.finished_jobs_default PARTITION OF pgwake.finished_jobs DEFAULT;

ALTER TABLE pgwake.dead_jobs ADD COLUMN worker_id text;
ALTER TABLE pgwake.dead_jobs ADD COLUMN started_at timestamptz;

-- Dead and cancelled jobs into the history, from whichever path buried
-- them. Statement-level with a transition table: one call per bury
-- statement; with history off it costs one lookup of the settings row.
-- `last_error = 'cancelled'` is how the cancel path marks a cancellation.
CREATE FUNCTION pgwake.record_dead() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pgwake.history_settings WHERE keep IS NOT NULL) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        INSERT INTO pgwake.finished_jobs
            (id, queue, task, payload, outcome, error, attempts, enqueued_at, started_at,
             finished_at, worker)
        SELECT id, queue, task, payload,
               CASE WHEN last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               last_error, attempts, created_at, started_at, clock_timestamp(), worker_id
        FROM new_rows;
    ELSE
        -- A bury that found the id already dead (ON CONFLICT … DO UPDATE
        -- sets failed_at): a new death. Other updates are not.
        INSERT INTO pgwake.finished_jobs
            (id, queue, task, payload, outcome, error, attempts, enqueued_at, started_at,
             finished_at, worker)
        SELECT n.id, n.queue, n.task, n.payload,
               CASE WHEN n.last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END,
               n.last_error, n.attempts, n.created_at, n.started_at, clock_timestamp(), n.worker_id
        FROM new_rows n JOIN old_rows o USING (id)
        WHERE n.failed_at IS DISTINCT FROM o.failed_at;
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER dead_jobs_history_insert AFTER INSERT ON pgwake.dead_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgwake.record_dead();
CREATE TRIGGER dead_jobs_history_update AFTER UPDATE ON pgwake.dead_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION pgwake.record_dead();

-- The partition for one UTC day: `pgwake.finished_jobs_YYYYMMDD`. Returns
-- whether it was created (false: it exists). Rows of that day already in
-- the DEFAULT partition (written before the partition existed) are moved
-- into it: the new table is filled first and then attached, so the default
-- partition's check passes. Run under the caller's lock_timeout; SECURITY
-- DEFINER so a worker role needs no DDL rights.
CREATE FUNCTION pgwake.history_partition(day date) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    name text := 'finished_jobs_' || to_char(day, 'YYYYMMDD');
    lo timestamptz := day::timestamp AT TIME ZONE 'UTC';
    hi timestamptz := (day + 1)::timestamp AT TIME ZONE 'UTC';
BEGIN
    IF to_regclass(format('pgwake.%I', name)) IS NOT NULL THEN
        RETURN false;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pgwake.finished_jobs_default
                   WHERE finished_at >= lo AND finished_at < hi) THEN
        EXECUTE format(
            'CREATE TABLE pgwake.%I PARTITION OF pgwake.finished_jobs FOR VALUES FROM (%L) TO (%L)',
            name, lo, hi);
        RETURN true;
    END IF;
    EXECUTE format(
        'CREATE TABLE pgwake.%I (LIKE pgwake.finished_jobs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)',
        name);
    EXECUTE format(
        'WITH moved AS (DELETE FROM pgwake.finished_jobs_default
                        WHERE finished_at >= %L AND finished_at < %L RETURNING *)
         INSERT INTO pgwake.%I SELECT * FROM moved',
        lo, hi, name);
    EXECUTE format(
        'ALTER TABLE pgwake.finished_jobs ATTACH PARTITION pgwake.%I FOR VALUES FROM (%L) TO (%L)',
        name, lo, hi);
    RETURN true;
END
$$;

-- One round of history maintenance (run by one worker at a time, under an
-- advisory lock, each DDL waiting at most `lock_wait` for its lock): create the partitions of today
-- and the next `ahead` days, drop every daily partition whose rows are all
-- older than `keep`, and delete such rows from the default partition (it is
-- empty unless partitions were missing). Each DDL runs in its own
-- subtransaction: one that cannot get its lock is reported in `failed` and
-- tried again next round. `rows_dropped` counts from the planner's
-- statistics (exact when the partition was never analysed).
CREATE FUNCTION pgwake.history_maintain(keep interval, ahead integer, lock_wait interval)
RETURNS TABLE (created integer, dropped integer, rows_dropped bigint, failed text[])
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    today date := (now() AT TIME ZONE 'UTC')::date;
    d date;
    i integer;
    p record;
    n bigint;
BEGIN
    created := 0; dropped := 0; rows_dropped := 0; failed := '{}';
    -- Local to the caller's transaction: CREATE and DROP of a partition
    -- lock the parent; behind a long history write they give up quickly
    -- instead of making later history writes queue behind them.
    PERFORM set_config('lock_timeout', (extract(epoch FROM lock_wait) * 1000)::bigint::text, true);
    FOR i IN 0..ahead LOOP
        d := today + i;
        BEGIN
            IF pgwake.history_partition(d) THEN
                created := created + 1;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            failed := failed || format('create %s: %s', d, SQLERRM);
        END;
    END LOOP;
    IF keep IS NULL THEN
        RETURN NEXT;
        RETURN;
    END IF;
    FOR p IN
        SELECT c.oid, c.relname, c.reltuples
        FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'pgwake.finished_jobs'::regclass
          AND c.relname ~ '^finished_jobs_[0-9]{8}$'
          AND (to_date(substr(c.relname, 15), 'YYYYMMDD') + 1)::timestamp AT TIME ZONE 'UTC'
              <= now() - keep
        ORDER BY c.relname
    LOOP
        BEGIN
            IF p.reltuples >= 0 THEN
                n := p.reltuples::bigint;
            ELSE
                EXECUTE format('SELECT count(*) FROM pgwake.%I', p.relname) INTO n;
            END IF;
            EXECUTE format('DROP TABLE pgwake.%I', p.relname);
            dropped := dropped + 1;
            rows_dropped := rows_dropped + n;
        EXCEPTION WHEN OTHERS THEN
            failed := failed || format('drop %s: %s', p.relname, SQLERRM);
        END;
    END LOOP;
    BEGIN
        DELETE FROM pgwake.finished_jobs_default WHERE finished_at < now() - keep;
        GET DIAGNOSTICS n = ROW_COUNT;
        rows_dropped := rows_dropped + n;
    EXCEPTION WHEN OTHERS THEN
        failed := failed || format('trim default partition: %s', SQLERRM);
    END;
    RETURN NEXT;
END
$$;
REVOKE EXECUTE ON FUNCTION pgwake.history_partition(date) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION pgwake.history_maintain(interval, integer, interval) FROM PUBLIC;
