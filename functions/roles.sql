-- Least-privilege grants for the three kinds of role that use pgwake.
-- Run as the owner of the pgwake schema (whoever ran `pgwake migrate`):
--
--   SELECT pgwake.grant_producer('app');         -- enqueue jobs
--   SELECT pgwake.grant_worker('pgwake_worker'); -- run `pgwake run`, `pgwake dead retry|purge`, `pgwake cancel`
--   SELECT pgwake.grant_monitor('grafana');      -- `pgwake stats`, `pgwake dead list`, dashboards
--
-- Idempotent; run them again after a `pgwake migrate` that added tables.
-- Seeing other roles' sessions in the idle-in-transaction gauges also needs
-- `GRANT pg_monitor TO <worker or monitor role>` (a superuser grants that).

CREATE OR REPLACE FUNCTION pgwake.grant_producer(role regrole) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgwake TO %s', role);
    -- INSERT … RETURNING id (the client, pgwake.enqueue) reads the id; a
    -- duplicate's id is found by its unique_key.
    EXECUTE format('GRANT INSERT, SELECT (id, unique_key) ON pgwake.jobs TO %s', role);
    -- `unique_running`: is a job of the key running (leased)?
    EXECUTE format('GRANT SELECT (id, unique_key) ON pgwake.leased_jobs TO %s', role);
    -- The insert trigger reads which workers are waiting.
    EXECUTE format('GRANT SELECT ON pgwake.waiting_workers TO %s', role);
    -- `pgwake enqueue` checks the schema version first.
    EXECUTE format('GRANT SELECT ON pgwake.schema_migrations TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval, text, text, boolean, text), pgwake.enqueue_unique(text, jsonb, text, timestamptz, integer, integer, interval, text, text, boolean, text) TO %s', role);
END
$$;

CREATE OR REPLACE FUNCTION pgwake.grant_worker(role regrole) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgwake TO %s', role);
    -- Queue tables: claims delete, outcomes insert and update, registrations
    -- come and go. The bookkeeping of migrations is read-only.
    FOR t IN SELECT tablename FROM pg_tables
             WHERE schemaname = 'pgwake' AND tablename NOT LIKE 'schema\_%'
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgwake.%I TO %s', t, role);
    END LOOP;
    EXECUTE format('GRANT SELECT ON pgwake.schema_migrations TO %s', role);
    -- Recurring jobs: `pgwake schedule …` and the view of them.
    EXECUTE format('GRANT SELECT ON pgwake.schedule_list TO %s', role);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgwake TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval, text, text, boolean, text), pgwake.enqueue_unique(text, jsonb, text, timestamptz, integer, integer, interval, text, text, boolean, text) TO %s', role);
    -- History: partitions are created ahead and dropped by the worker.
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.history_partition(date) TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.history_maintain(interval, integer, interval) TO %s', role);
    -- `pgwake cancel`: an operator's action, like `pgwake dead retry`.
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.cancel(bigint), pgwake.request_cancel(bigint) TO %s', role);
    -- `pgwake queue pause|resume|set`: an operator's action.
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.pause_queue(text), pgwake.resume_queue(text), pgwake.set_queue_max_running(text, integer), pgwake.set_queue_rate(text, integer, interval), pgwake.set_queue_rate_per_key(text, integer, interval), pgwake.set_queue_limit_key_path(text, text), pgwake.set_queue_fair_keys(text, boolean), pgwake.set_queue_max_running_per_key(text, integer), pgwake.set_queue_key_max_running(text, text, integer) TO %s', role);
END
$$;

CREATE OR REPLACE FUNCTION pgwake.grant_monitor(role regrole) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgwake TO %s', role);
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA pgwake TO %s', role);
END
$$;
