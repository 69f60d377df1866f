-- SQL API of recurring jobs (the CLI and the Rust API call these too, so
-- every path validates the same way). The worker evaluates expressions with
-- the croner crate; what SQL cannot judge (a day that never comes, a zone
-- PostgreSQL knows but the worker's IANA copy does not) is recorded by the
-- first worker that sees the schedule in its `error` column, shown by
-- `pgwake schedule list` and the pgwake_schedules{state="invalid"} gauge.
--
--   SELECT pgwake.schedule_add('nightly-report', '0 3 * * *', 'report',
--                              tz => 'Europe/Berlin', catch_up => '2');
--   SELECT * FROM pgwake.schedule_list;
--   SELECT pgwake.schedule_remove('nightly-report');

-- NULL when `expr` is a well-formed cron expression, else why not.
CREATE OR REPLACE FUNCTION pgwake.schedule_cron_problem(expr text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    labels constant text[] := ARRAY['second', 'minute', 'hour', 'day-of-month', 'month', 'day-of-week'];
    lo     constant int[]  := ARRAY[0, 0, 0, 1, 1, 0];
    hi     constant int[]  := ARRAY[59, 59, 23, 31, 12, 7];
    months constant text[] := ARRAY['JAN','FEB','MAR','APR','MAY','JUN','JUL','AUG','SEP','OCT','NOV','DEC'];
    days   constant text[] := ARRAY['SUN','MON','TUE','WED','THU','FRI','SAT'];
    fields text[];
    n      int;
    k      int;
    f      text;
    item   text;
    num    text;
BEGIN
    IF expr IS NULL OR btrim(expr) = '' THEN
        RETURN 'the cron expression is empty';
    END IF;
    IF lower(btrim(expr)) IN ('@yearly', '@annually', '@monthly', '@weekly', '@daily', '@hourly') THEN
        RETURN NULL;
    END IF;
    fields := regexp_split_to_array(btrim(expr), '\s+');
    n := cardinality(fields);
    IF n NOT IN (5, 6) THEN
        RETURN format('%L has %s fields; expected 5 (minute hour day-of-month month day-of-week) or 6 (second first)',
                      expr, n);
    END IF;
    FOR i IN 1..n LOOP
        k := i + 6 - n;
        f := upper(fields[i]);
        IF k = 5 THEN
            FOR j IN 1..12 LOOP f := replace(f, months[j], j::text); END LOOP;
        ELSIF k = 6 THEN
            FOR j IN 1..7 LOOP f := replace(f, days[j], (j - 1)::text); END LOOP;
            IF left(f, 1) = '+' THEN f := substr(f, 2); END IF;
        END IF;
        FOREACH item IN ARRAY string_to_array(f, ',') LOOP
            IF k IN (4, 6) AND item = '?' OR k = 4 AND item IN ('L', 'LW') THEN
                CONTINUE;
            ELSIF k = 4 AND item ~ '^\d+W$' THEN
                item := rtrim(item, 'W');
            ELSIF k = 6 AND item ~ '^\d+(-\d+)?(#([1-5]|L)|L)$' THEN
                item := regexp_replace(item, '(#.*|L)$', '');
            ELSIF item !~ '^(\*|\d+(-\d+)?)(/\d+)?$' THEN
                RETURN format('%s field %L: %L is not *, N, A-B, */S or A-B/S', labels[k], fields[i], item);
            ELSIF item ~ '^\d+/' THEN
                RETURN format('%s field %L: %L steps from a single value; write */S or A-B/S', labels[k], fields[i], item);
            ELSIF item ~ '/0+$' THEN
                RETURN format('%s field %L: a step must be at least 1', labels[k], fields[i]);
            END IF;
            FOR num IN SELECT m[1] FROM regexp_matches(split_part(item, '/', 1), '(\d+)', 'g') AS m LOOP
                IF num::numeric < lo[k] OR num::numeric > hi[k] THEN
                    RETURN format('%s field %L: %s is outside %s-%s', labels[k], fields[i], num, lo[k], hi[k]);
                END IF;
            END LOOP;
        END LOOP;
    END LOOP;
    RETURN NULL;
END
$$;

-- Add a schedule (or, with replace => true, redefine one: its next tick is
-- then computed afresh from now). Raises invalid_parameter_value (22023)
-- naming the argument, or unique_violation (23505) for a taken name.
CREATE OR REPLACE FUNCTION pgwake.schedule_add(
    name     text,
    cron     text,
    task     text,
    payload  jsonb   DEFAULT '{}'::jsonb,
    queue    text    DEFAULT 'default',
    priority integer DEFAULT 0,
    tz       text    DEFAULT 'UTC',
    catch_up text    DEFAULT 'skip',
    replace  boolean DEFAULT false
) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    problem text;
    n       integer;
BEGIN
    IF name IS NULL OR name = '' OR octet_length(name) > 128 OR name ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'name: must be 1-128 bytes without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    problem := pgwake.schedule_cron_problem(cron);
    IF problem IS NOT NULL THEN
        RAISE EXCEPTION 'cron: %', problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF task IS NULL OR task = '' OR octet_length(task) > 256 THEN
        RAISE EXCEPTION 'task: must be 1-256 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF queue IS NULL OR queue = '' OR octet_length(queue) > 128 OR queue ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'queue: must be 1-128 bytes without control characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- Every tick inserts a job with this payload: the jobs' bound
    -- (pgwake.producer_limits, migration 0027) holds for it too.
    IF octet_length(coalesce(payload, '{}'::jsonb)::text)
       > coalesce((SELECT l.payload_max_bytes FROM pgwake.producer_limits l), 1048576) THEN
        RAISE EXCEPTION 'payload: % bytes as JSON text: at most % bytes are allowed (pgwake.producer_limits.payload_max_bytes)',
            octet_length(payload::text),
            coalesce((SELECT l.payload_max_bytes FROM pgwake.producer_limits l), 1048576)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF tz IS NULL OR NOT EXISTS (SELECT 1 FROM pg_timezone_names z WHERE z.name = tz) THEN
        RAISE EXCEPTION 'tz: unknown time zone %; use an IANA name such as UTC or Europe/Berlin', quote_literal(tz)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF catch_up = 'skip' THEN
        n := 0;
    ELSIF catch_up ~ '^\d{1,4}$' AND catch_up::int BETWEEN 1 AND 1000 THEN
        n := catch_up::int;
    ELSE
        RAISE EXCEPTION 'catch_up: %; expected skip or a number of missed ticks from 1 to 1000', quote_literal(catch_up)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF replace THEN
        -- A changed definition starts afresh; counters are kept.
        UPDATE pgwake.schedules s
        SET cron = btrim(cron), tz = tz, task = task, payload = coalesce(payload, '{}'::jsonb),
            queue = queue, priority = coalesce(priority, 0), catch_up = n,
            next_tick = now(), fresh = true, error = NULL, updated_at = now()
        WHERE s.name = name;
        IF FOUND THEN
            RETURN;
        END IF;
    END IF;
    INSERT INTO pgwake.schedules (name, cron, tz, task, payload, queue, priority, catch_up)
    VALUES (name, btrim(cron), tz, task, coalesce(payload, '{}'::jsonb), queue,
            coalesce(priority, 0), n);
EXCEPTION WHEN unique_violation THEN
    RAISE EXCEPTION 'a schedule named % already exists', quote_literal(name)
        USING ERRCODE = 'unique_violation',
              HINT = 'remove it first, or add it with replace => true (--replace)';
END
$$;

-- Remove a schedule; true if it existed. Jobs it already enqueued stay.
CREATE OR REPLACE FUNCTION pgwake.schedule_remove(name text) RETURNS boolean
LANGUAGE sql AS $$
    WITH gone AS (DELETE FROM pgwake.schedules s WHERE s.name = schedule_remove.name RETURNING 1)
    SELECT count(*) > 0 FROM gone
$$;

-- Every schedule, for people: catch-up as written, next tick NULL until a
-- worker has computed it (and while the schedule is invalid).
CREATE OR REPLACE VIEW pgwake.schedule_list AS
SELECT name, cron, tz, task, payload, queue, priority,
       CASE catch_up WHEN 0 THEN 'skip' ELSE catch_up::text END AS catch_up,
       CASE WHEN fresh OR error IS NOT NULL THEN NULL ELSE next_tick END AS next_tick,
       last_tick, last_job_id, ticks_enqueued, ticks_missed, ticks_waiting, error,
       created_at, updated_at, enabled
FROM pgwake.schedules;
