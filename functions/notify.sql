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
    -- First without a query: no registration outlives pgwake.waiting_until
    -- (migration 0024), so when it has passed none is live. (A function call
    -- in a plpgsql condition skips the executor a query goes through: this
    -- check costs producers about a tenth of what the query did.)
    IF coalesce(pg_sequence_last_value('pgwake.waiting_until'), 0)
           <= date_part('epoch', now()) * 1000 THEN
        RETURN NULL;
    END IF;
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

-- Every registration raises pgwake.waiting_until to its expiry (never
-- lowers it). SECURITY DEFINER: worker roles may read the sequence but not
-- set it (pgwake.grant_worker grants USAGE, SELECT on sequences); a
-- registration is rare (a worker falling idle), so its cost is no matter.
CREATE OR REPLACE FUNCTION pgwake.raise_waiting_until() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    PERFORM setval('pgwake.waiting_until',
                   greatest(coalesce(pg_sequence_last_value('pgwake.waiting_until'), 0),
                            CASE WHEN NEW.expires_at = 'infinity' THEN 9223372036854775807
                                 WHEN NEW.expires_at = '-infinity' THEN 0
                                 ELSE ceil(date_part('epoch', NEW.expires_at) * 1000)::bigint END));
    RETURN NULL;
END
$$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_trigger
                   WHERE tgname = 'waiting_workers_until'
                     AND tgrelid = 'pgwake.waiting_workers'::regclass) THEN
        CREATE TRIGGER waiting_workers_until
            AFTER INSERT OR UPDATE OF expires_at ON pgwake.waiting_workers
            FOR EACH ROW EXECUTE FUNCTION pgwake.raise_waiting_until();
    END IF;
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
