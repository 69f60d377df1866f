-- Least-privilege grants for the three kinds of role that use pgwake.
-- Run as the owner of the pgwake schema (whoever ran `pgwake migrate`):
--
--   SELECT pgwake.grant_producer('app');         -- enqueue jobs
--   SELECT pgwake.grant_worker('pgwake_worker'); -- run `pgwake run`, `pgwake dead retry|purge`, `pgwake cancel`
--   SELECT pgwake.grant_monitor('grafana');      -- `pgwake stats`, `pgwake dead list`, dashboards,
--                                                -- autoscalers (pgwake.queue_pressure)
--
-- Idempotent. Each records the role in `pgwake.role_grants`, and every
-- `pgwake migrate` that changed something re-applies the recorded grants
-- (`pgwake.apply_grants()`), so an upgrade that adds tables or functions
-- needs no step of its own.
--
-- EXECUTE on the schema's functions is never left to PUBLIC: `pgwake
-- migrate` revokes it after every change (ARCHITECTURE.md, "Least
-- privilege"), so each role below is granted exactly the functions it
-- calls. Trigger functions need no grant: PostgreSQL checks EXECUTE on a
-- trigger function only when the trigger is created, never when it fires.
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
    -- The insert trigger jobs_bounds reads the payload bound (migration 0027).
    EXECUTE format('GRANT SELECT ON pgwake.producer_limits TO %s', role);
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval, text, text, boolean, text, text, text, bigint[], text, bigint), pgwake.enqueue_unique(text, jsonb, text, timestamptz, integer, integer, interval, text, text, boolean, text) TO %s', role);
    -- Parents of a job (SECURITY DEFINER: no grant on job_parents nor
    -- UPDATE on jobs; functions/flows.sql), and pgwake.flow.
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.add_parents(bigint, bigint[], text), pgwake.max_parents(), pgwake.flow(jsonb) TO %s', role);
    -- Batches (SECURITY DEFINER; functions/flows.sql).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.batch_open(text, jsonb, text, integer, integer, interval, text, text, interval), pgwake.batch_add(bigint, bigint), pgwake.batch_close(bigint), pgwake.batch_status(bigint), pgwake.max_batch_jobs() TO %s', role);
    -- The Rust client records each job's trace context (SECURITY DEFINER:
    -- no grant on pgwake.job_traces; functions/traces.sql).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.trace_job(bigint, text, text) TO %s', role);
    -- What enqueue and the insert triggers that run as the inserting role
    -- (not SECURITY DEFINER) call: the unique key's lock number.
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.unique_key_lock(text) TO %s', role);
    -- A producer that paces itself reads how much its queue has waiting
    -- (SECURITY DEFINER: counts only, no table of the queue's).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.queue_pressure(text, integer) TO %s', role);
    -- Signals to waiting jobs (SECURITY DEFINER: no UPDATE on jobs;
    -- functions/signals.sql).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.signal(text, jsonb, interval) TO %s', role);
    INSERT INTO pgwake.role_grants (role, kind) VALUES (role, 'producer') ON CONFLICT DO NOTHING;
END
$$;

CREATE OR REPLACE FUNCTION pgwake.grant_worker(role regrole) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    t text;
    f regprocedure;
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgwake TO %s', role);
    -- Queue tables: claims delete, outcomes insert and update, registrations
    -- come and go. The bookkeeping of migrations is read-only.
    FOR t IN SELECT tablename FROM pg_tables
             WHERE schemaname = 'pgwake' AND tablename NOT LIKE 'schema\_%'
               AND tablename <> 'role_grants'
    LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON pgwake.%I TO %s', t, role);
    END LOOP;
    EXECUTE format('GRANT SELECT ON pgwake.schema_migrations TO %s', role);
    -- Recurring jobs: `pgwake schedule …` and the view of them.
    EXECUTE format('GRANT SELECT ON pgwake.schedule_list TO %s', role);
    EXECUTE format('GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA pgwake TO %s', role);
    -- Every function of the schema but these grants (and apply_grants):
    -- claims, rescues,
    -- enqueue (retries, schedules), history partitions (created ahead and
    -- dropped by the worker), and the operator's actions `pgwake cancel`,
    -- `pgwake queue pause|resume|set`, `pgwake schedule add|remove`.
    FOR f IN SELECT p.oid::regprocedure FROM pg_proc p
             WHERE p.pronamespace = 'pgwake'::regnamespace
               AND p.prokind = 'f'
               AND p.proname NOT LIKE 'grant\_%' AND p.proname <> 'apply_grants'
               AND p.prorettype <> 'trigger'::regtype
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s', f, role);
    END LOOP;
    INSERT INTO pgwake.role_grants (role, kind) VALUES (role, 'worker') ON CONFLICT DO NOTHING;
END
$$;

CREATE OR REPLACE FUNCTION pgwake.grant_monitor(role regrole) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA pgwake TO %s', role);
    EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA pgwake TO %s', role);
    -- The count of malformed trace contexts (a sequence: ALL TABLES leaves
    -- it out), read by the sampler and `pgwake stats`.
    EXECUTE format('GRANT SELECT ON SEQUENCE pgwake.trace_context_rejected TO %s', role);
    -- The read-only functions of `pgwake explain`, `pgwake jobs list`, the
    -- fleet's unserved jobs and the console's pages.
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.explain(bigint), pgwake.list_jobs(text, text, text, text, text, jsonb, bigint, integer, timestamptz), pgwake.unserved_jobs(integer, integer), pgwake.unslotted_running(text), pgwake.unslotted_key_running(text, text), pgwake.held_by_claim(xid), pgwake.explain_process_wait(text, text[]), pgwake.queue_pressure(text, integer), pgwake.progress_current(bigint, bigint, xid8), pgwake.job_progress_of(bigint[]), pgwake.explain_progress(bigint), pgwake.batch_status(bigint) TO %s', role);
    -- The governor's reading (a monitor's call records nothing: it may not
    -- write the state, see functions/pressure.sql).
    EXECUTE format('GRANT EXECUTE ON FUNCTION pgwake.pressure(), pgwake.pressure_duration(float8) TO %s', role);
    INSERT INTO pgwake.role_grants (role, kind) VALUES (role, 'monitor') ON CONFLICT DO NOTHING;
END
$$;

-- Every recorded role's grants again, as they are now (new tables, new
-- functions): `pgwake migrate` calls it after each run that changed
-- something. Roles dropped since are forgotten. Returns what it granted.
CREATE OR REPLACE FUNCTION pgwake.apply_grants() RETURNS TABLE (role_name name, kind text)
LANGUAGE plpgsql AS $$
DECLARE
    g record;
BEGIN
    DELETE FROM pgwake.role_grants rg WHERE NOT EXISTS (SELECT 1 FROM pg_roles r WHERE r.oid = rg.role);
    FOR g IN SELECT r.rolname, rg.kind FROM pgwake.role_grants rg JOIN pg_roles r ON r.oid = rg.role
             ORDER BY rg.kind, r.rolname
    LOOP
        EXECUTE format('SELECT pgwake.grant_%s(%L::regrole)', g.kind, quote_ident(g.rolname));
        role_name := g.rolname;
        kind := g.kind;
        RETURN NEXT;
    END LOOP;
END
$$;
