-- The governor (migration 0032, issue 35 item 2): how much pressure the
-- database is under, as a level with hysteresis, recorded when it changes.
--
--   SELECT * FROM pgwake.pressure();
--     level     ok | elevated | critical
--     since     when the level was entered
--     changed   true for the one caller whose call changed the level
--     causes    jsonb array, one object per cause (see below)
--     previous  the level before this call (= level unless it changed it)
--
--   SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 30);
--
-- Three measures drive the level, each against an elevated and a critical
-- threshold (pgwake.pressure_settings):
--
--   horizon       seconds since the oldest open transaction of this database
--                 began (a session's xact_start, our own left out) or a
--                 prepared transaction was prepared: what keeps the vacuum
--                 horizon back, with its holder (pid, application_name,
--                 state; or the prepared transaction's gid)
--   dead_tuples   n_dead_tup of pgwake.jobs, leased_jobs and tx_batches,
--                 summed (per table in the cause)
--   notify_queue  pg_notification_queue_usage()
--
-- Hysteresis: a measure enters a level at its threshold and leaves it only
-- below threshold × leave_ratio; the new level is
--   greatest(entered, least(current, stayed))
-- where `entered` is the highest level any measure reaches at the enter
-- thresholds and `stayed` the highest at the leave thresholds. So a level
-- rises as soon as one measure crosses its threshold and falls only when
-- every measure is well below it: no flapping at a threshold.
--
-- Reported as causes but not driving the level (kind, level 'info'):
-- replication slots holding an xmin (replication_slot), a vacuum running
-- on a queue table now (autovacuum), standbys in pg_stat_replication with
-- their lag (replication), and `visibility` when the caller lacks
-- pg_read_all_stats.
--
-- Every cause: {"kind", "level", "detail" (one line for people), …the
-- measure's fields}. The horizon cause adds "seconds", "holder"
-- ('session' or 'prepared transaction'), "pid", "application_name",
-- "state" or "gid".
--
-- Recording: a caller whose reading differs from pgwake.pressure_state
-- locks that row (SELECT … FOR UPDATE), decides again from the level as it
-- is now (a concurrent caller may have changed it since it was read), and
-- only if it still differs writes it (UPDATE … WHERE level IS DISTINCT FROM
-- …), appends the change to pgwake.pressure_log (entries older than a day
-- are deleted then) and sheds, all in the caller's transaction: `changed`
-- is true for exactly one caller per change. Entering critical pauses the
-- queues with shed_under_pressure that are not paused (paused_by =
-- 'pressure'); leaving critical resumes the queues still paused by
-- pressure. Both go through pgwake.queues, whose trigger
-- (functions/queues.sql) tells the workers to hand back a paused queue's
-- prefetched jobs; a resumed queue is notified on the wake-up channel. A
-- reading without a change writes nothing.
--
-- A caller that cannot see every session (no pg_read_all_stats), may not
-- write the state (a monitor role) or is in a read-only transaction (a
-- standby, a console) gets its own reading (with the recorded level's
-- hysteresis) and records nothing: a partial view must not lower the
-- level the governor acts on. SECURITY INVOKER: what it reads is what the
-- caller may read.
CREATE OR REPLACE FUNCTION pgwake.pressure_duration(seconds float8) RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN seconds < 120 THEN round(seconds)::bigint || ' s'
        WHEN seconds < 7200 THEN round(seconds / 60)::bigint || ' min'
        ELSE round((seconds / 3600)::numeric, 1)::text || ' h'
    END
$$;

CREATE OR REPLACE FUNCTION pgwake.pressure()
RETURNS TABLE (level text, since timestamptz, changed boolean, causes jsonb, previous text)
LANGUAGE plpgsql SECURITY INVOKER AS $$
DECLARE
    names constant text[] := ARRAY['ok', 'elevated', 'critical'];
    s pgwake.pressure_settings;
    st pgwake.pressure_state;
    sees_all boolean := pg_has_role(current_user, 'pg_read_all_stats', 'USAGE');
    may_write boolean;
    cur int;
    h record;
    r record;
    -- Per measure: the level reached at the enter thresholds (e_) and at
    -- the leave thresholds (s_).
    e_h int := 0; s_h int := 0;
    e_d int; s_d int;
    e_n int; s_n int;
    dead bigint := 0;
    dead_tables jsonb := '{}';
    notify_usage float8 := pg_notification_queue_usage();
    info jsonb := '[]';
    out_causes jsonb;
    new_level int;
    did_change boolean := false;
    paused_queues text[] := '{}';
    resumed_queues text[] := '{}';
BEGIN
    SELECT * INTO s FROM pgwake.pressure_settings;
    SELECT * INTO st FROM pgwake.pressure_state;

    -- The horizon: the oldest open transaction of this database (other
    -- databases' sessions do not hold back this database's tables) or
    -- prepared transaction. Vacuum's own transactions are left out: other
    -- vacuums ignore them.
    SELECT x.holder, x.pid, x.who, x.state, x.gid, x.seconds INTO h FROM (
        SELECT 'session'::text AS holder, a.pid, coalesce(a.application_name, '') AS who,
               a.state, NULL::text AS gid,
               greatest(0, extract(epoch FROM now() - a.xact_start))::float8 AS seconds
        FROM pg_stat_activity a
        WHERE a.pid <> pg_backend_pid() AND a.datname = current_database()
          AND a.xact_start IS NOT NULL AND a.backend_type <> 'autovacuum worker'
        UNION ALL
        SELECT 'prepared transaction', NULL, p.owner::text, 'prepared', p.gid,
               greatest(0, extract(epoch FROM now() - p.prepared))::float8
        FROM pg_prepared_xacts p
        WHERE p.database = current_database()
    ) x ORDER BY x.seconds DESC LIMIT 1;
    IF FOUND THEN
        e_h := CASE WHEN h.seconds >= s.horizon_critical_seconds THEN 2
                    WHEN h.seconds >= s.horizon_elevated_seconds THEN 1 ELSE 0 END;
        s_h := CASE WHEN h.seconds >= s.horizon_critical_seconds * s.leave_ratio THEN 2
                    WHEN h.seconds >= s.horizon_elevated_seconds * s.leave_ratio THEN 1 ELSE 0 END;
    END IF;

    -- Dead tuples of the queue tables (to_regclass: a table an older or
    -- newer schema lacks is skipped).
    FOR r IN SELECT t.relid::regclass::text AS rel, t.n_dead_tup AS n
             FROM pg_stat_user_tables t
             WHERE t.relid IN (SELECT c FROM unnest(ARRAY[to_regclass('pgwake.jobs'),
                               to_regclass('pgwake.leased_jobs'), to_regclass('pgwake.tx_batches')]) c
                               WHERE c IS NOT NULL)
    LOOP
        dead := dead + r.n;
        dead_tables := dead_tables || jsonb_build_object(r.rel, r.n);
    END LOOP;
    e_d := CASE WHEN dead >= s.dead_tuples_critical THEN 2
                WHEN dead >= s.dead_tuples_elevated THEN 1 ELSE 0 END;
    s_d := CASE WHEN dead >= s.dead_tuples_critical * s.leave_ratio THEN 2
                WHEN dead >= s.dead_tuples_elevated * s.leave_ratio THEN 1 ELSE 0 END;

    e_n := CASE WHEN notify_usage >= s.notify_critical THEN 2
                WHEN notify_usage >= s.notify_elevated THEN 1 ELSE 0 END;
    s_n := CASE WHEN notify_usage >= s.notify_critical * s.leave_ratio THEN 2
                WHEN notify_usage >= s.notify_elevated * s.leave_ratio THEN 1 ELSE 0 END;

    -- Informational causes.
    FOR r IN SELECT sl.slot_name::text AS slot, sl.active, sl.slot_type,
                    greatest(age(sl.xmin), age(sl.catalog_xmin))::int8 AS xid_age
             FROM pg_replication_slots sl
             WHERE sl.xmin IS NOT NULL
                OR (sl.catalog_xmin IS NOT NULL AND sl.database = current_database())
    LOOP
        info := info || jsonb_build_array(jsonb_build_object(
            'kind', 'replication_slot', 'level', 'info',
            'slot', r.slot, 'active', r.active, 'xid_age', r.xid_age,
            'detail', format('%s replication slot %s (%s) holds an xmin %s transactions old',
                             r.slot_type, quote_literal(r.slot),
                             CASE WHEN r.active THEN 'active' ELSE 'inactive: drop it if its consumer is gone' END,
                             r.xid_age)));
    END LOOP;
    FOR r IN SELECT v.pid, v.relid::regclass::text AS rel, v.phase
             FROM pg_stat_progress_vacuum v
             WHERE v.datname = current_database()
               AND v.relid IN (to_regclass('pgwake.jobs'), to_regclass('pgwake.leased_jobs'),
                               to_regclass('pgwake.tx_batches'))
    LOOP
        info := info || jsonb_build_array(jsonb_build_object(
            'kind', 'autovacuum', 'level', 'info', 'pid', r.pid, 'table', r.rel, 'phase', r.phase,
            'detail', format('vacuum of %s running (pid %s, %s)', r.rel, r.pid, r.phase)));
    END LOOP;
    FOR r IN SELECT rp.pid, coalesce(rp.application_name, '') AS who, rp.state,
                    extract(epoch FROM rp.replay_lag)::float8 AS lag,
                    age(rp.backend_xmin)::int8 AS xmin_age
             FROM pg_stat_replication rp
    LOOP
        info := info || jsonb_build_array(jsonb_build_object(
            'kind', 'replication', 'level', 'info', 'pid', r.pid, 'application_name', r.who,
            'state', r.state, 'replay_lag_seconds', r.lag, 'xmin_age', r.xmin_age,
            'detail', format('standby %s (%s): replay lag %s%s', quote_literal(r.who),
                             coalesce(r.state, 'state not visible'),
                             coalesce(pgwake.pressure_duration(r.lag), 'unknown'),
                             CASE WHEN r.xmin_age IS NOT NULL
                                  THEN format(', its feedback holds an xmin %s transactions old', r.xmin_age)
                                  ELSE '' END)));
    END LOOP;
    IF NOT sees_all THEN
        info := info || jsonb_build_array(jsonb_build_object(
            'kind', 'visibility', 'level', 'info', 'role', current_user::text,
            'detail', format('role %s cannot see the sessions of other roles (no pg_read_all_stats): their transactions are not measured and this reading changes nothing; GRANT pg_monitor TO %s',
                             quote_ident(current_user::text), quote_ident(current_user::text))));
    END IF;

    cur := array_position(names, st.level) - 1;
    new_level := greatest(greatest(e_h, e_d, e_n), least(cur, greatest(s_h, s_d, s_n)));
    may_write := sees_all
        AND current_setting('transaction_read_only') = 'off'
        AND has_table_privilege('pgwake.pressure_state', 'UPDATE')
        AND has_table_privilege('pgwake.pressure_log', 'INSERT, DELETE')
        AND has_table_privilege('pgwake.queues', 'UPDATE');
    IF may_write AND new_level <> cur THEN
        -- A change: lock the state and decide again from the level as it is
        -- now (a concurrent caller may have changed it since our read), so
        -- that each change is made, logged and acted on once.
        SELECT * INTO st FROM pgwake.pressure_state FOR UPDATE;
        cur := array_position(names, st.level) - 1;
        new_level := greatest(greatest(e_h, e_d, e_n), least(cur, greatest(s_h, s_d, s_n)));
    END IF;

    -- The causes: each driving measure at the level it holds on its own
    -- (with hysteresis), when above ok; then the informational ones.
    out_causes := '[]';
    IF greatest(e_h, least(cur, s_h)) > 0 THEN
        out_causes := out_causes || jsonb_build_array(jsonb_build_object(
            'kind', 'horizon',
            'level', names[greatest(e_h, least(cur, s_h)) + 1],
            'seconds', round(h.seconds::numeric, 1),
            'elevated', s.horizon_elevated_seconds,
            'critical', s.horizon_critical_seconds,
            'holder', h.holder,
            'pid', h.pid,
            'application_name', h.who,
            'state', h.state,
            'gid', h.gid,
            'detail', CASE WHEN h.holder = 'session' THEN
                format('horizon held %s by pid %s (%s), %s', pgwake.pressure_duration(h.seconds),
                       h.pid, coalesce(nullif(h.who, ''), 'no application_name'),
                       coalesce(h.state, 'state not visible'))
            ELSE
                format('horizon held %s by prepared transaction %s (owner %s): COMMIT PREPARED or ROLLBACK PREPARED it',
                       pgwake.pressure_duration(h.seconds), quote_literal(h.gid), h.who)
            END));
    END IF;
    IF greatest(e_d, least(cur, s_d)) > 0 THEN
        out_causes := out_causes || jsonb_build_array(jsonb_build_object(
            'kind', 'dead_tuples',
            'level', names[greatest(e_d, least(cur, s_d)) + 1],
            'value', dead,
            'elevated', s.dead_tuples_elevated,
            'critical', s.dead_tuples_critical,
            'tables', dead_tables,
            'detail', format('%s dead tuples in the queue tables, not yet vacuumed', dead)));
    END IF;
    IF greatest(e_n, least(cur, s_n)) > 0 THEN
        out_causes := out_causes || jsonb_build_array(jsonb_build_object(
            'kind', 'notify_queue',
            'level', names[greatest(e_n, least(cur, s_n)) + 1],
            'value', notify_usage,
            'elevated', s.notify_elevated,
            'critical', s.notify_critical,
            'detail', format('the NOTIFY queue is %s%% full: a session that LISTENs does not read its notifications',
                             round((notify_usage * 100)::numeric, 1))));
    END IF;
    out_causes := out_causes || info;

    IF may_write AND new_level <> cur THEN
        UPDATE pgwake.pressure_state ps
        SET level = names[new_level + 1], since = now(), causes = out_causes
        WHERE ps.level IS DISTINCT FROM names[new_level + 1];
        did_change := true;
        IF new_level = 2 THEN
            -- Entering critical: shed. The queues' trigger tells the
            -- workers to hand back what they prefetched of these queues.
            WITH p AS (
                UPDATE pgwake.queues q
                SET paused = true, paused_at = now(), paused_by = 'pressure', updated_at = now()
                WHERE q.shed_under_pressure AND NOT q.paused
                RETURNING q.name)
            SELECT coalesce(array_agg(p.name ORDER BY p.name), '{}') INTO paused_queues FROM p;
        ELSIF cur = 2 THEN
            -- Leaving critical: resume what the governor paused and nobody
            -- resumed or paused again since.
            WITH p AS (
                UPDATE pgwake.queues q
                SET paused = false, paused_at = NULL, paused_by = NULL, updated_at = now()
                WHERE q.paused_by = 'pressure'
                RETURNING q.name)
            SELECT coalesce(array_agg(p.name ORDER BY p.name), '{}') INTO resumed_queues FROM p;
            PERFORM pg_notify('pgwake', q) FROM unnest(resumed_queues) q;
        END IF;
        DELETE FROM pgwake.pressure_log pl WHERE pl.at < now() - interval '1 day';
        INSERT INTO pgwake.pressure_log (level, previous, causes, actions)
        VALUES (names[new_level + 1], names[cur + 1], out_causes,
                jsonb_build_object('paused', to_jsonb(paused_queues),
                                   'resumed', to_jsonb(resumed_queues)));
    END IF;

    level := names[new_level + 1];
    since := CASE WHEN new_level <> cur THEN now() ELSE st.since END;
    changed := did_change;
    causes := out_causes;
    previous := names[cur + 1];
    RETURN NEXT;
END
$$;

-- Set the thresholds: each argument left NULL keeps its value. Refuses
-- nonsense with the allowed range (the table's CHECKs would too, less
-- clearly). Returns the settings as they are now, as a json object.
CREATE OR REPLACE FUNCTION pgwake.set_pressure_thresholds(
    horizon_elevated_seconds float8 DEFAULT NULL,
    horizon_critical_seconds float8 DEFAULT NULL,
    dead_tuples_elevated bigint DEFAULT NULL,
    dead_tuples_critical bigint DEFAULT NULL,
    notify_elevated float8 DEFAULT NULL,
    notify_critical float8 DEFAULT NULL,
    leave_ratio float8 DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    s pgwake.pressure_settings;
BEGIN
    SELECT * INTO s FROM pgwake.pressure_settings FOR UPDATE;
    s.horizon_elevated_seconds := coalesce(set_pressure_thresholds.horizon_elevated_seconds, s.horizon_elevated_seconds);
    s.horizon_critical_seconds := coalesce(set_pressure_thresholds.horizon_critical_seconds, s.horizon_critical_seconds);
    s.dead_tuples_elevated := coalesce(set_pressure_thresholds.dead_tuples_elevated, s.dead_tuples_elevated);
    s.dead_tuples_critical := coalesce(set_pressure_thresholds.dead_tuples_critical, s.dead_tuples_critical);
    s.notify_elevated := coalesce(set_pressure_thresholds.notify_elevated, s.notify_elevated);
    s.notify_critical := coalesce(set_pressure_thresholds.notify_critical, s.notify_critical);
    s.leave_ratio := coalesce(set_pressure_thresholds.leave_ratio, s.leave_ratio);
    IF NOT (s.horizon_elevated_seconds > 0 AND s.horizon_elevated_seconds < s.horizon_critical_seconds
            AND s.horizon_critical_seconds <= 604800) THEN
        RAISE EXCEPTION 'pgwake.set_pressure_thresholds: horizon thresholds must satisfy 0 < elevated < critical <= 604800 seconds (got elevated %, critical %)',
            s.horizon_elevated_seconds, s.horizon_critical_seconds USING ERRCODE = '22023';
    END IF;
    IF NOT (s.dead_tuples_elevated > 0 AND s.dead_tuples_elevated < s.dead_tuples_critical) THEN
        RAISE EXCEPTION 'pgwake.set_pressure_thresholds: dead-tuple thresholds must satisfy 0 < elevated < critical (got elevated %, critical %)',
            s.dead_tuples_elevated, s.dead_tuples_critical USING ERRCODE = '22023';
    END IF;
    IF NOT (s.notify_elevated > 0 AND s.notify_elevated < s.notify_critical AND s.notify_critical <= 1) THEN
        RAISE EXCEPTION 'pgwake.set_pressure_thresholds: NOTIFY queue thresholds must satisfy 0 < elevated < critical <= 1 (got elevated %, critical %)',
            s.notify_elevated, s.notify_critical USING ERRCODE = '22023';
    END IF;
    IF NOT (s.leave_ratio > 0 AND s.leave_ratio < 1) THEN
        RAISE EXCEPTION 'pgwake.set_pressure_thresholds: leave_ratio must be in (0, 1), exclusive (got %)',
            s.leave_ratio USING ERRCODE = '22023';
    END IF;
    UPDATE pgwake.pressure_settings ps SET
        horizon_elevated_seconds = s.horizon_elevated_seconds,
        horizon_critical_seconds = s.horizon_critical_seconds,
        dead_tuples_elevated = s.dead_tuples_elevated,
        dead_tuples_critical = s.dead_tuples_critical,
        notify_elevated = s.notify_elevated,
        notify_critical = s.notify_critical,
        leave_ratio = s.leave_ratio;
    RETURN to_jsonb(s) - 'singleton';
END
$$;
