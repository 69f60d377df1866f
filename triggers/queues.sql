-- SQL admin API of queue settings (migration 0009, `pgwake queue …`):
--
--   SELECT pgwake.pause_queue('mail');   -- true: it was running, now paused
--   SELECT pgwake.resume_queue('mail');  -- true: it was paused, now running
--
-- A paused queue starts no new job on any worker: every claim statement
-- reads pgwake.queues (src/sql/claim_*.sql), so a claim that starts after
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
    UPDATE pgwake.queues q SET paused = false, paused_at = NULL, updated_at = now()
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
-- them, see src/sql/claim_*_limited.sql). Raising the limit adds rows.
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
    IF set_queue_max_running.max_running < 1 THEN
        RAISE EXCEPTION 'pgwake.set_queue_max_running: max_running must be at least 1 (NULL: no limit), got %',
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
