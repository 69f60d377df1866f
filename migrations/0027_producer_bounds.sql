-- pgwake schema, version 27: the SQL API's own bounds on what a producer
-- sends (issue 33, item 5). A plain INSERT or pgwake.enqueue took a payload
-- of any size (up to jsonb's 255 MB), which every worker that claims it
-- then holds in memory, and a task name over 256 bytes was refused only by
-- the CHECK jobs_task_valid, whose message names the constraint, not the
-- limit.
--
-- * `pgwake.producer_limits`, one row: `payload_max_bytes`, the largest
--   payload of a new job, as JSON text (`octet_length(payload::text)`:
--   what the claim hands a handler); 1 MiB by default, 64 KiB to 256 MiB.
-- * The insert trigger jobs_bounds (BEFORE INSERT, so before the CHECKs and
--   the key triggers) refuses a new job whose task name is over 256 bytes
--   or whose payload is over the setting, with SQLSTATE 54000
--   (program_limit_exceeded), a message naming the limit and a HINT naming
--   the fix. Its WHEN clause is what nearly every insert pays (about
--   0.3 µs a row, measured; ARCHITECTURE.md): a payload of at most 8 KiB
--   (uncompressed) never calls the function, which measures the text.
-- * A schedule's payload is a new job's at every tick: schedule_add
--   refuses one over the bound, the bound starts at the largest payload of
--   the schedules already there if that is more than 1 MiB, and it cannot
--   be lowered below one (trigger producer_limits_fit_schedules).
-- * New jobs only: a row whose created_at is before the inserting
--   transaction began is a job put back (a retry, a rescue, a dead retry, a
--   hand-back), which keeps its payload whatever its size, so jobs stored
--   before this migration, or before the setting was lowered, still run
--   and retry. (A producer that writes an old created_at itself passes too:
--   the bound stops mistakes, not a producer who means harm.)
--
-- Cost of this migration: a new table, and CREATE TRIGGER, which takes
-- pgwake.jobs' SHARE ROW EXCLUSIVE lock briefly (lock_timeout and retry,
-- src/admin/schema.rs); no row is read or checked.
CREATE TABLE pgwake.producer_limits (
    singleton         boolean PRIMARY KEY DEFAULT true
        CONSTRAINT producer_limits_singleton CHECK (singleton),
    payload_max_bytes integer NOT NULL DEFAULT 1048576
        CONSTRAINT producer_limits_payload_max_bytes_range
        CHECK (payload_max_bytes BETWEEN 65536 AND 268435456)
);
-- 1 MiB, or the largest payload a schedule already has: every tick
-- inserts its schedule's payload, and one refused tick would stop every
-- schedule due with it.
INSERT INTO pgwake.producer_limits (payload_max_bytes)
SELECT least(greatest(1048576, max(octet_length(payload::text))), 268435456)
FROM pgwake.schedules;

-- The bound cannot go below a schedule's payload, for the same reason.
CREATE FUNCTION pgwake.producer_limits_fit_schedules() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    s record;
BEGIN
    SELECT name, octet_length(payload::text) AS bytes INTO s
    FROM pgwake.schedules
    WHERE octet_length(payload::text) > NEW.payload_max_bytes
    ORDER BY 2 DESC LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'pgwake: schedule % has a payload of % bytes, over the new bound of % bytes',
            to_jsonb(s.name)::text, s.bytes, NEW.payload_max_bytes
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Every tick enqueues its payload: give the schedule a smaller payload (pgwake schedule add --replace) or remove it first.';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER producer_limits_fit_schedules
    BEFORE INSERT OR UPDATE ON pgwake.producer_limits
    -- out of range: the CHECK says so
    FOR EACH ROW WHEN (NEW.payload_max_bytes BETWEEN 65536 AND 268435456)
    EXECUTE FUNCTION pgwake.producer_limits_fit_schedules();

-- As in functions/enqueue.sql at this version (which every migrate
-- re-applies when its text changes): the trigger needs it now.
CREATE OR REPLACE FUNCTION pgwake.check_job_bounds() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    max_bytes integer;
    bytes     integer;
BEGIN
    IF octet_length(NEW.task) > 256 THEN
        RAISE EXCEPTION 'pgwake: a task name of % bytes: at most 256 bytes are allowed',
            octet_length(NEW.task)
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'A task name names the handler that runs the job (pgwake run --handler TASK=...): put the data in the payload.';
    END IF;
    SELECT l.payload_max_bytes INTO max_bytes FROM pgwake.producer_limits l;
    max_bytes := coalesce(max_bytes, 1048576);
    bytes := octet_length(NEW.payload::text);
    IF bytes > max_bytes THEN
        -- The task as JSON: quoted, any control character escaped.
        RAISE EXCEPTION 'pgwake: the payload of a job of task % is % bytes as JSON text: at most % bytes are allowed',
            to_jsonb(left(NEW.task, 64))::text, bytes, max_bytes
            USING ERRCODE = 'program_limit_exceeded',
                  HINT = 'Keep large data elsewhere (a table, object storage) and put its key in the payload, or raise the limit: UPDATE pgwake.producer_limits SET payload_max_bytes = N (65536 to 268435456).';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER jobs_bounds
    BEFORE INSERT ON pgwake.jobs
    FOR EACH ROW
    -- O(1) for nearly every job: the datum's size (a jsonb's binary form
    -- is at least a sixth of its text: a control character is 1 byte
    -- there and 6 as \u0001 in the text, nothing more), so a payload whose
    -- text is over 64 KiB, the least bound, is over 8 KiB here, unless
    -- compressed (copied from another table), which is measured too.
    WHEN (NEW.created_at >= now()
          AND (octet_length(NEW.task) > 256
               OR pg_column_size(NEW.payload) > 8192
               OR pg_column_compression(NEW.payload) IS NOT NULL))
    EXECUTE FUNCTION pgwake.check_job_bounds();
