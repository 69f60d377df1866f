-- SQL admin API of queue settings (migration 0009, `pgwake queue …`):
--
--   SELECT pgwake.pause_queue('mail');   -- true: it was running, now paused
--   SELECT pgwake.resume_queue('mail');  -- true: it was paused, now running
--   SELECT pgwake.set_queue_shed_under_pressure('reports', true);
--
-- A paused queue starts no new job on any worker: every claim statement
-- reads pgwake.queues (src/db/sql/claim_*.sql), so a claim that starts after
-- pause_queue() committed takes nothing from the queue. Jobs already running
-- (and those a claim took concurrently with the pause) finish. The state is
-- a row: it survives restarts of workers and of the database.
CREATE OR REPLACE FUNCTION pgwake.pause_queue(queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    changed boolean;
BEGIN
    IF queue IS NULL OR queue = '' THEN
        RAISE EXCEPTION 'pgwake.pause_queue: the queue name must not be empty';
    END IF;
    INSERT INTO pgwake.queues AS q (name, paused, paused_at)
    VALUES (pause_queue.queue, true, now())
    ON CONFLICT (name) DO UPDATE SET paused = true, paused_at = now(), updated_at = now()
        WHERE NOT q.paused
    RETURNING true INTO changed;
    -- A queue the governor shed (paused_by = 'pressure', functions/
    -- pressure.sql) becomes the operator's: it stays paused when the
    -- pressure falls. It was paused already: false.
    UPDATE pgwake.queues q SET paused_by = NULL, updated_at = now()
    WHERE q.name = pause_queue.queue AND q.paused_by IS NOT NULL;
    RETURN coalesce(changed, false);
END
$$;

-- Resume: claims take the queue's jobs again; a NOTIFY on the wake-up
-- channel (payload: the queue, as the insert trigger sends) starts idle
-- workers at once instead of at their next poll.
CREATE OR REPLACE FUNCTION pgwake.resume_queue(queue text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    changed boolean;
BEGIN
    -- paused_by: a queue the governor shed and an operator resumed stays
    -- resumed (the governor resumes only what is still paused by it).
    UPDATE pgwake.queues q SET paused = false, paused_at = NULL, paused_by = NULL, updated_at = now()
    WHERE q.name = resume_queue.queue AND q.paused
    RETURNING true INTO changed;
    IF coalesce(changed, false) THEN
        PERFORM pg_notify('pgwake', resume_queue.queue);
    END IF;
    RETURN coalesce(changed, false);
END
$$;

-- At most `max_running` jobs of the queue run at once, across every worker
-- (NULL: no limit). Returns nothing; `pgwake queue list` shows the setting.
--
-- Slots 1..max_running exist as rows of pgwake.queue_slots (the claims hold
-- them, see src/db/sql/claim_*_limited.sql). Raising the limit adds rows.
-- Lowering it (or clearing it) deletes the free rows above the new limit;
-- a held one stays until its job ends, and while any row above the limit
-- remains, claims start no job of the queue: the jobs running when the limit
-- was lowered finish first, and the new limit is never exceeded by a job
-- started after the change.
CREATE OR REPLACE FUNCTION pgwake.set_queue_max_running(queue text, max_running integer)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF set_queue_max_running.queue IS NULL OR set_queue_max_running.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_max_running: the queue name must not be empty';
    END IF;
    IF set_queue_max_running.max_running < 1 OR set_queue_max_running.max_running > 100000 THEN
        RAISE EXCEPTION 'pgwake.set_queue_max_running: max_running must be between 1 and 100000 (NULL: no limit), got %',
            set_queue_max_running.max_running;
    END IF;
    -- The upsert locks the queue's row: concurrent changes run one at a time.
    INSERT INTO pgwake.queues AS q (name, max_running)
    VALUES (set_queue_max_running.queue, set_queue_max_running.max_running)
    ON CONFLICT (name) DO UPDATE SET max_running = excluded.max_running, updated_at = now();
    IF set_queue_max_running.max_running IS NOT NULL THEN
        INSERT INTO pgwake.queue_slots (queue, slot)
        SELECT set_queue_max_running.queue, g
        FROM generate_series(1, set_queue_max_running.max_running) g
        ON CONFLICT DO NOTHING;
    END IF;
    DELETE FROM pgwake.queue_slots s
    WHERE (s.queue, s.slot) IN (
        SELECT x.queue, x.slot FROM pgwake.queue_slots x
        WHERE x.queue = set_queue_max_running.queue AND x.lease_token IS NULL
          AND (set_queue_max_running.max_running IS NULL
               OR x.slot > set_queue_max_running.max_running)
        FOR UPDATE SKIP LOCKED);
    -- More slots, or no limit: idle workers may start jobs now.
    PERFORM pg_notify('pgwake', set_queue_max_running.queue);
END
$$;

-- At most `count` jobs of the queue are admitted in any window of `per`
-- (sliding), across every worker; NULL count: no rate limit. For example
-- pgwake.set_queue_rate('mail', 20, '1 second').
--
-- Slots 1..count are rows of pgwake.queue_rate_slots (migration 0010, see
-- src/db/sql/rate_reserve.sql). Raising the limit adds free slots. Lowering it
-- keeps the newest admissions in the remaining slots, so a queue that was
-- running at its old rate does not get a fresh burst: any window that begins
-- after the change admits at most the new count (one that straddles it holds
-- at most what the old limit let in before the change plus the new count).
CREATE OR REPLACE FUNCTION pgwake.set_queue_rate(queue text, count integer, per interval DEFAULT interval '1 second')
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF set_queue_rate.queue IS NULL OR set_queue_rate.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_rate: the queue name must not be empty';
    END IF;
    IF set_queue_rate.count IS NOT NULL THEN
        IF set_queue_rate.count NOT BETWEEN 1 AND 100000 THEN
            RAISE EXCEPTION 'pgwake.set_queue_rate: count must be between 1 and 100000 (NULL: no limit), got %',
                set_queue_rate.count;
        END IF;
        IF set_queue_rate.per IS NULL OR set_queue_rate.per <= interval '0' THEN
            RAISE EXCEPTION 'pgwake.set_queue_rate: the window must be longer than 0, got %',
                set_queue_rate.per;
        END IF;
    END IF;
    -- The upsert locks the queue's row: concurrent changes run one at a time.
    INSERT INTO pgwake.queues AS q (name, rate_count, rate_window)
    VALUES (set_queue_rate.queue, set_queue_rate.count,
            CASE WHEN set_queue_rate.count IS NOT NULL THEN set_queue_rate.per END)
    ON CONFLICT (name) DO UPDATE
        SET rate_count = excluded.rate_count, rate_window = excluded.rate_window, updated_at = now();
    IF set_queue_rate.count IS NULL THEN
        DELETE FROM pgwake.queue_rate_slots s WHERE s.queue = set_queue_rate.queue;
    ELSE
        -- Wait for admissions in flight (row locks of a few milliseconds),
        -- then keep the newest `count` admission times in slots 1..count.
        PERFORM FROM pgwake.queue_rate_slots s WHERE s.queue = set_queue_rate.queue FOR UPDATE;
        WITH ranked AS (
            SELECT s.last_start, row_number() OVER (ORDER BY s.last_start DESC, s.slot) AS n
            FROM pgwake.queue_rate_slots s WHERE s.queue = set_queue_rate.queue
        )
        UPDATE pgwake.queue_rate_slots s
        SET last_start = r.last_start, prev_start = '-infinity'
        FROM ranked r
        WHERE s.queue = set_queue_rate.queue AND s.slot = r.n AND r.n <= set_queue_rate.count;
        DELETE FROM pgwake.queue_rate_slots s
        WHERE s.queue = set_queue_rate.queue AND s.slot > set_queue_rate.count;
        INSERT INTO pgwake.queue_rate_slots (queue, slot)
        SELECT set_queue_rate.queue, g FROM generate_series(1, set_queue_rate.count) g
        ON CONFLICT DO NOTHING;
    END IF;
    -- A higher rate, or none: idle workers may start jobs now.
    PERFORM pg_notify('pgwake', set_queue_rate.queue);
END
$$;

-- At most `count` jobs of any one limit key of the queue are admitted in
-- any window of `per` (sliding), across every worker; NULL count: no
-- per-key rate. Jobs without a key are not limited by it. For example
-- pgwake.set_queue_rate_per_key('webhooks', 10, '1 second').
--
-- Admission slots are rows of pgwake.key_rate_slots (migration 0021),
-- created by the reservations as keys need them. Changing the rate keeps
-- each key's newest `count` admissions in its slots 1..count, so a key
-- running at its old rate gets no fresh burst (as set_queue_rate).
CREATE OR REPLACE FUNCTION pgwake.set_queue_rate_per_key(queue text, count integer,
                                                         per interval DEFAULT interval '1 second')
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    kept_keys text[];
    kept_slots integer[];
    kept_starts timestamptz[];
BEGIN
    IF set_queue_rate_per_key.queue IS NULL OR set_queue_rate_per_key.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_rate_per_key: the queue name must not be empty';
    END IF;
    IF set_queue_rate_per_key.count IS NOT NULL THEN
        IF set_queue_rate_per_key.count NOT BETWEEN 1 AND 100000 THEN
            RAISE EXCEPTION 'pgwake.set_queue_rate_per_key: count must be between 1 and 100000 (NULL: no per-key rate), got %',
                set_queue_rate_per_key.count;
        END IF;
        IF set_queue_rate_per_key.per IS NULL OR set_queue_rate_per_key.per <= interval '0' THEN
            RAISE EXCEPTION 'pgwake.set_queue_rate_per_key: the window must be longer than 0, got %',
                set_queue_rate_per_key.per;
        END IF;
    END IF;
    -- The upsert locks the queue's row: concurrent changes run one at a time.
    INSERT INTO pgwake.queues AS q (name, key_rate_count, key_rate_window)
    VALUES (set_queue_rate_per_key.queue, set_queue_rate_per_key.count,
            CASE WHEN set_queue_rate_per_key.count IS NOT NULL THEN set_queue_rate_per_key.per END)
    ON CONFLICT (name) DO UPDATE
        SET key_rate_count = excluded.key_rate_count, key_rate_window = excluded.key_rate_window,
            updated_at = now();
    IF set_queue_rate_per_key.count IS NOT NULL THEN
        -- Wait for admissions in flight (row locks of a few milliseconds),
        -- then keep each key's newest `count` admission times.
        SELECT array_agg(r.limit_key), array_agg(r.n::integer), array_agg(r.last_start)
        INTO kept_keys, kept_slots, kept_starts
        FROM (SELECT s.limit_key, s.last_start,
                     row_number() OVER (PARTITION BY s.limit_key ORDER BY s.last_start DESC, s.slot) AS n
              FROM (SELECT y.limit_key, y.slot, y.last_start FROM pgwake.key_rate_slots y
                    WHERE y.queue = set_queue_rate_per_key.queue FOR UPDATE) s) r
        WHERE r.n <= set_queue_rate_per_key.count;
    END IF;
    DELETE FROM pgwake.key_rate_slots s WHERE s.queue = set_queue_rate_per_key.queue;
    INSERT INTO pgwake.key_rate_slots (queue, limit_key, slot, last_start)
    SELECT set_queue_rate_per_key.queue, u.k, u.n, u.t
    FROM unnest(kept_keys, kept_slots, kept_starts) AS u(k, n, t);
    -- A higher rate, or none: idle workers may start jobs now.
    PERFORM pg_notify('pgwake', set_queue_rate_per_key.queue);
END
$$;

-- Jobs of the queue enqueued without a limit key take the payload's
-- top-level field `path` as their key (NULL path: none), for example
-- pgwake.set_queue_limit_key_path('exports', 'customer_id'). Applies to jobs
-- inserted from the commit on (the insert trigger jobs_fill_limit_key,
-- migration 0020); jobs already waiting keep their key.
--
-- The insert trigger is created by the first call that sets a path (an
-- installation without paths does not pay for it on every insert): that
-- call needs a brief lock of pgwake.jobs that waits for running tx-mode
-- claims (at most 5 s, then it fails and says so: try again). SECURITY
-- DEFINER: the worker role may set queue settings but does not own the
-- table.
CREATE OR REPLACE FUNCTION pgwake.set_queue_limit_key_path(queue text, path text)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    IF set_queue_limit_key_path.queue IS NULL OR set_queue_limit_key_path.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_limit_key_path: the queue name must not be empty';
    END IF;
    IF set_queue_limit_key_path.path = '' OR octet_length(set_queue_limit_key_path.path) > 200
       OR set_queue_limit_key_path.path ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'pgwake.set_queue_limit_key_path: the path must be a payload field name of 1 to 200 bytes without control characters (NULL: none), got %',
            quote_literal(set_queue_limit_key_path.path);
    END IF;
    INSERT INTO pgwake.queues AS q (name, limit_key_path)
    VALUES (set_queue_limit_key_path.queue, set_queue_limit_key_path.path)
    ON CONFLICT (name) DO UPDATE SET limit_key_path = excluded.limit_key_path, updated_at = now();
    IF set_queue_limit_key_path.path IS NOT NULL
       AND NOT EXISTS (SELECT FROM pg_trigger t
                       WHERE t.tgrelid = 'pgwake.jobs'::regclass AND t.tgname = 'jobs_fill_limit_key') THEN
        PERFORM set_config('lock_timeout', '5s', true);
        BEGIN
            CREATE TRIGGER jobs_fill_limit_key
                BEFORE INSERT ON pgwake.jobs
                FOR EACH ROW WHEN (NEW.limit_key IS NULL)
                EXECUTE FUNCTION pgwake.fill_limit_key();
        EXCEPTION WHEN lock_not_available THEN
            RAISE EXCEPTION 'pgwake.set_queue_limit_key_path: the first limit key path creates an insert trigger, which waits for running tx-mode jobs; it waited 5 s: try again (nothing was changed)'
                USING ERRCODE = 'lock_not_available';
        END;
    END IF;
END
$$;

-- Claims of the queue take its ready jobs in rotation between limit keys
-- (on) or in plain claim order (off); see src/db/sql/claim_*_fair_keys.sql.
CREATE OR REPLACE FUNCTION pgwake.set_queue_fair_keys(queue text, fair boolean)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF set_queue_fair_keys.queue IS NULL OR set_queue_fair_keys.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_fair_keys: the queue name must not be empty';
    END IF;
    INSERT INTO pgwake.queues AS q (name, fair_keys)
    VALUES (set_queue_fair_keys.queue, coalesce(set_queue_fair_keys.fair, false))
    ON CONFLICT (name) DO UPDATE SET fair_keys = excluded.fair_keys, updated_at = now();
    PERFORM pg_notify('pgwake', set_queue_fair_keys.queue);
END
$$;

-- Shed the queue under pressure (migration 0032): while pgwake.pressure()
-- is critical, the queue is paused (paused_by = 'pressure'), and resumed
-- when the level falls below critical, unless an operator paused or resumed
-- it in between. Pausing happens at the change to critical: a queue marked
-- while the level is already critical is paused at the next change to
-- critical, not now (an operator who wants it stopped now pauses it).
CREATE OR REPLACE FUNCTION pgwake.set_queue_shed_under_pressure(queue text, shed boolean)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF set_queue_shed_under_pressure.queue IS NULL OR set_queue_shed_under_pressure.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_shed_under_pressure: the queue name must not be empty';
    END IF;
    IF set_queue_shed_under_pressure.shed IS NULL THEN
        RAISE EXCEPTION 'pgwake.set_queue_shed_under_pressure: shed must be true or false';
    END IF;
    INSERT INTO pgwake.queues AS q (name, shed_under_pressure)
    VALUES (set_queue_shed_under_pressure.queue, set_queue_shed_under_pressure.shed)
    ON CONFLICT (name) DO UPDATE SET shed_under_pressure = excluded.shed_under_pressure, updated_at = now()
        WHERE q.shed_under_pressure IS DISTINCT FROM excluded.shed_under_pressure;
END
$$;

-- The insert trigger of migration 0020: a job inserted without a limit key
-- takes the payload field its queue's `limit_key_path` names (none: NULL).
-- SECURITY DEFINER: a producer need not read pgwake.queues.
CREATE OR REPLACE FUNCTION pgwake.fill_limit_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    NEW.limit_key := NEW.payload ->> (SELECT q.limit_key_path FROM pgwake.queues q
                                      WHERE q.name = NEW.queue);
    RETURN NEW;
END
$$;

-- A lease that held a key slot ended (done, retried, buried, rescued,
-- cancelled): its slot is free in the same transaction. Fenced by the
-- claim token, never reused: a second release matches nothing.
CREATE OR REPLACE FUNCTION pgwake.release_key_slot() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    UPDATE pgwake.key_slots SET lease_token = NULL WHERE lease_token = OLD.token;
    RETURN NULL;
END
$$;

-- The slots 1..limit of a keyed job's key, when its queue has per-key
-- limits and the key has none yet: made by the producer's insert, so that
-- a claim (which may hold its transaction while the job runs) only ever
-- locks rows, never inserts one another claim would wait for.
CREATE OR REPLACE FUNCTION pgwake.add_key_slots() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
DECLARE
    lim integer;
BEGIN
    SELECT coalesce((SELECT l.max_running FROM pgwake.queue_key_limits l
                     WHERE l.queue = NEW.queue AND l.limit_key = NEW.limit_key),
                    q.max_running_per_key)
    INTO lim
    FROM pgwake.queues q WHERE q.name = NEW.queue AND q.key_limits;
    IF lim IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pgwake.key_slots s
                                       WHERE s.queue = NEW.queue AND s.limit_key = NEW.limit_key) THEN
        INSERT INTO pgwake.key_slots (queue, limit_key, slot)
        SELECT NEW.queue, NEW.limit_key, g FROM generate_series(1, lim) g
        ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END
$$;

-- Add the missing slot rows 1..limit of `keys` of `queue` that have a
-- limit and a job (waiting, scheduled, held or leased): the keys a claim
-- found with a ready job and fewer rows (pgwake.fair_key_jobs). The worker
-- runs this in a statement of its own; a key's rows can go missing when a
-- job of it is inserted while its rows are being deleted (the rescuer's
-- sweep, a limit change) and its insert trigger saw them still there.
-- Returns the rows added; wakes the queue's workers when it added any.
CREATE OR REPLACE FUNCTION pgwake.repair_key_slots(queue text, keys text[]) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    added bigint;
BEGIN
    -- A producer inserting the same rows (its key had none) holds them
    -- until it commits: wait a little, then give up (the next claim that
    -- visits the key reports it again).
    PERFORM set_config('lock_timeout', '1s', true);
    WITH limits AS (
        SELECT k.key,
               coalesce((SELECT l.max_running FROM pgwake.queue_key_limits l
                         WHERE l.queue = q.name AND l.limit_key = k.key),
                        q.max_running_per_key) AS lim
        FROM unnest(repair_key_slots.keys) AS k(key), pgwake.queues q
        WHERE q.name = repair_key_slots.queue AND q.key_limits
          AND (EXISTS (SELECT FROM pgwake.jobs j
                       WHERE j.queue = q.name AND j.limit_key COLLATE "C" = k.key AND NOT j.held)
               OR EXISTS (SELECT FROM pgwake.jobs j
                          WHERE j.queue = q.name AND j.limit_key COLLATE "C" = k.key AND j.held)
               OR EXISTS (SELECT FROM pgwake.leased_jobs l
                          WHERE l.queue = q.name AND l.limit_key = k.key))
    ),
    ins AS (
        INSERT INTO pgwake.key_slots (queue, limit_key, slot)
        SELECT repair_key_slots.queue, limits.key, g
        FROM limits, generate_series(1, limits.lim) g
        WHERE limits.lim IS NOT NULL
        ON CONFLICT DO NOTHING
        RETURNING 1
    )
    SELECT count(*) INTO added FROM ins;
    IF added > 0 THEN
        PERFORM pg_notify('pgwake', repair_key_slots.queue);
    END IF;
    RETURN added;
END
$$;

-- Give the keys of `queue` their slots for the current limits: rows
-- 1..limit for every key with a waiting or running job or with rows
-- already; the free rows above a key's limit are deleted (held ones stay
-- and block the key's new starts until they are free).
CREATE OR REPLACE FUNCTION pgwake.resize_key_slots(queue text) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    per_key integer;
BEGIN
    SELECT q.max_running_per_key INTO per_key FROM pgwake.queues q WHERE q.name = resize_key_slots.queue;
    WITH keys AS (
        SELECT j.limit_key FROM pgwake.jobs j
        WHERE j.queue = resize_key_slots.queue AND j.limit_key IS NOT NULL
        UNION
        SELECT l.limit_key FROM pgwake.leased_jobs l
        WHERE l.queue = resize_key_slots.queue AND l.limit_key IS NOT NULL
        UNION
        SELECT s.limit_key FROM pgwake.key_slots s WHERE s.queue = resize_key_slots.queue
        UNION
        SELECT k.limit_key FROM pgwake.queue_key_limits k WHERE k.queue = resize_key_slots.queue
    ),
    limits AS (
        SELECT keys.limit_key,
               coalesce((SELECT k.max_running FROM pgwake.queue_key_limits k
                         WHERE k.queue = resize_key_slots.queue AND k.limit_key = keys.limit_key),
                        per_key) AS lim
        FROM keys
    ),
    added AS (
        INSERT INTO pgwake.key_slots (queue, limit_key, slot)
        SELECT resize_key_slots.queue, limits.limit_key, g
        FROM limits, generate_series(1, limits.lim) g
        WHERE limits.lim IS NOT NULL
        ON CONFLICT DO NOTHING
    )
    DELETE FROM pgwake.key_slots s
    WHERE (s.queue, s.limit_key, s.slot) IN (
        SELECT x.queue, x.limit_key, x.slot
        FROM pgwake.key_slots x LEFT JOIN limits ON limits.limit_key = x.limit_key
        WHERE x.queue = resize_key_slots.queue AND x.lease_token IS NULL
          AND (limits.lim IS NULL OR x.slot > limits.lim)
        FOR UPDATE OF x SKIP LOCKED);
    UPDATE pgwake.queues q
    SET key_limits = q.max_running_per_key IS NOT NULL
                     OR EXISTS (SELECT 1 FROM pgwake.queue_key_limits k WHERE k.queue = q.name),
        updated_at = now()
    WHERE q.name = resize_key_slots.queue;
    -- More slots, or none: idle workers may start jobs now.
    PERFORM pg_notify('pgwake', resize_key_slots.queue);
END
$$;

-- At most `max_running` jobs of any one limit key of the queue run at once,
-- across every worker (NULL: no per-key limit); a key's own limit
-- (set_queue_key_max_running) takes precedence.
CREATE OR REPLACE FUNCTION pgwake.set_queue_max_running_per_key(queue text, max_running integer)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF set_queue_max_running_per_key.queue IS NULL OR set_queue_max_running_per_key.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_max_running_per_key: the queue name must not be empty';
    END IF;
    IF set_queue_max_running_per_key.max_running NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'pgwake.set_queue_max_running_per_key: max_running must be between 1 and 100000 (NULL: no limit), got %',
            set_queue_max_running_per_key.max_running;
    END IF;
    -- The upsert locks the queue's row: concurrent changes run one at a time.
    INSERT INTO pgwake.queues AS q (name, max_running_per_key)
    VALUES (set_queue_max_running_per_key.queue, set_queue_max_running_per_key.max_running)
    ON CONFLICT (name) DO UPDATE SET max_running_per_key = excluded.max_running_per_key,
                                     updated_at = now();
    PERFORM pgwake.resize_key_slots(set_queue_max_running_per_key.queue);
END
$$;

-- Key `limit_key` of the queue runs at most `max_running` jobs at once
-- (NULL: the queue's max_running_per_key again).
CREATE OR REPLACE FUNCTION pgwake.set_queue_key_max_running(queue text, limit_key text, max_running integer)
RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF set_queue_key_max_running.queue IS NULL OR set_queue_key_max_running.queue = '' THEN
        RAISE EXCEPTION 'pgwake.set_queue_key_max_running: the queue name must not be empty';
    END IF;
    IF set_queue_key_max_running.limit_key IS NULL THEN
        RAISE EXCEPTION 'pgwake.set_queue_key_max_running: the limit key must not be NULL';
    END IF;
    IF set_queue_key_max_running.max_running NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'pgwake.set_queue_key_max_running: max_running must be between 1 and 100000 (NULL: the queue''s per-key limit), got %',
            set_queue_key_max_running.max_running;
    END IF;
    INSERT INTO pgwake.queues AS q (name) VALUES (set_queue_key_max_running.queue)
    ON CONFLICT (name) DO UPDATE SET updated_at = now();
    IF set_queue_key_max_running.max_running IS NULL THEN
        DELETE FROM pgwake.queue_key_limits k
        WHERE k.queue = set_queue_key_max_running.queue
          AND k.limit_key = set_queue_key_max_running.limit_key;
    ELSE
        INSERT INTO pgwake.queue_key_limits AS k (queue, limit_key, max_running)
        VALUES (set_queue_key_max_running.queue, set_queue_key_max_running.limit_key,
                set_queue_key_max_running.max_running)
        ON CONFLICT (queue, limit_key) DO UPDATE SET max_running = excluded.max_running;
    END IF;
    PERFORM pgwake.resize_key_slots(set_queue_key_max_running.queue);
END
$$;

-- A queue that becomes paused or limited (max_running, a rate, fair keys,
-- per-key limits or rates) tells the workers on the control channel
-- (payload `queue <name>`, delivered at commit): each hands back, attempt
-- refunded, the jobs of that queue it prefetched before the change and has
-- not started (issue 33, item 3), since such a queue is claimed for free
-- slots only, under its limits. Settings change rarely: a row of its own
-- table, never written by claims.
CREATE OR REPLACE FUNCTION pgwake.queue_restricted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('pgwake_control', 'queue ' || NEW.name);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER queues_restricted
AFTER INSERT OR UPDATE ON pgwake.queues
FOR EACH ROW
WHEN (NEW.paused OR NEW.max_running IS NOT NULL OR NEW.rate_count IS NOT NULL
      OR NEW.fair_keys OR NEW.key_limits OR NEW.key_rate_count IS NOT NULL)
EXECUTE FUNCTION pgwake.queue_restricted();
