-- Wake-up trigger: one NOTIFY on channel `pgwake` per distinct queue among the
-- inserted rows that are ready now, whatever the number of rows, and only
-- for queues some idle worker is waiting on (pgwake.waiting_workers). The
-- payload is the queue name only: notifications are hints, never data. Rows
-- scheduled for later send nothing; the worker's poller sleeps until they
-- are due.
--
-- A bulk load can skip the notifications with `SET pgwake.notify = off`
-- (session) or `SET LOCAL pgwake.notify = off` (transaction); the fallback
-- poll picks the jobs up.
CREATE OR REPLACE FUNCTION pgwake.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    q text;
BEGIN
    IF current_setting('pgwake.notify', true) = 'off' THEN
        RETURN NULL;
    END IF;
    -- Nobody idle: the busy workers will find these rows on their next claim.
    IF NOT EXISTS (SELECT 1 FROM pgwake.waiting_workers WHERE expires_at > now()) THEN
        RETURN NULL;
    END IF;
    FOR q IN
        SELECT DISTINCT n.queue FROM pgwake_new_jobs n
        WHERE n.run_at <= now()
          AND EXISTS (SELECT 1 FROM pgwake.waiting_workers w
                      WHERE w.expires_at > now() AND (w.queues IS NULL OR n.queue = ANY (w.queues)))
    LOOP
        PERFORM pg_notify('pgwake', q);
    END LOOP;
    RETURN NULL;
END
$$;

-- Created only when missing: CREATE/DROP TRIGGER lock pgwake.jobs against
-- every insert and claim, and the definition above is all that ever
-- changes. A change to the trigger itself belongs in a numbered migration.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'jobs_notify' AND tgrelid = 'pgwake.jobs'::regclass) THEN
        CREATE TRIGGER jobs_notify
            AFTER INSERT ON pgwake.jobs
            REFERENCING NEW TABLE AS pgwake_new_jobs
            FOR EACH STATEMENT EXECUTE FUNCTION pgwake.notify_jobs_inserted();
    END IF;
END
$$;
