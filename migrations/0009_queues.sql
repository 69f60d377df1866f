-- pgwake schema, version 9: per-queue settings (`pgwake queue …`,
-- pgwake.pause_queue() / pgwake.resume_queue()).
--
-- One row per queue that has a setting; a queue without a row has none (the
-- common case costs the claim one index probe of this small table, see
-- ARCHITECTURE.md → Queues). `paused`: no claim starts a job of this queue
-- until it is resumed; jobs already running finish. `max_running`: at most
-- this many jobs of the queue run at once across every worker (NULL: no
-- limit), enforced through pgwake.queue_slots.
CREATE TABLE pgwake.queues (
    name        text        PRIMARY KEY CHECK (name <> ''),
    paused      boolean     NOT NULL DEFAULT false,
    paused_at   timestamptz,
    max_running integer     CHECK (max_running > 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- One row per running-job slot of a limited queue, numbered 1..max_running
-- (rows above max_running are left over from a lowered limit and are deleted
-- once free). A tx-mode claim holds a slot by its row lock (FOR UPDATE, until
-- its transaction ends: a crash frees it with the rollback); a lease-mode
-- claim by writing its claim token into lease_token in the claim statement
-- (freed by the trigger below when the lease row goes, whichever way).
CREATE TABLE pgwake.queue_slots (
    queue       text    NOT NULL REFERENCES pgwake.queues (name) ON DELETE CASCADE,
    slot        integer NOT NULL CHECK (slot > 0),
    lease_token bigint,
    PRIMARY KEY (queue, slot)
);
CREATE INDEX queue_slots_lease_token_idx ON pgwake.queue_slots (lease_token)
    WHERE lease_token IS NOT NULL;

-- A lease ends (done, retried, buried, rescued, cancelled): its slot is free
-- in the same transaction. Fenced by the token, which is never reused: a
-- second release of the same lease matches nothing, so it can never free a
-- slot another run holds (solid_queue's issue #761: a limit of 1 ran 11
-- times after a lock was released twice).
CREATE FUNCTION pgwake.release_queue_slots() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgwake.queue_slots SET lease_token = NULL
    WHERE lease_token IN (SELECT token FROM pgwake_ended_leases);
    RETURN NULL;
END
$$;
CREATE TRIGGER leased_jobs_release_slots
    AFTER DELETE ON pgwake.leased_jobs
    REFERENCING OLD TABLE AS pgwake_ended_leases
    FOR EACH STATEMENT EXECUTE FUNCTION pgwake.release_queue_slots();
