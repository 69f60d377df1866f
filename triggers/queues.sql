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
