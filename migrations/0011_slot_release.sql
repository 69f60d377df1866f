-- pgwake schema, version 11: a lease frees its queue slot by a row-level
-- trigger that fires only for leases that hold one.
--
-- Version 9 freed slots with a statement-level AFTER DELETE trigger on
-- pgwake.leased_jobs, reading a transition table of every deleted lease.
-- It ran on every completion of every queue, limited or not: 0.09 ms of
-- server time per lease completion (0.21 ms against 0.12 ms), while almost
-- every lease belongs to a queue without a max_running limit.
--
-- `holds_slot` marks the leases that may hold a slot. Its default is true,
-- the safe side: a writer that does not know the column (a pgwake binary
-- older than this schema, a hand-written INSERT) gets the release, which
-- on a lease without a slot matches nothing. Only the claims of queues
-- without a limit (src/sql/claim_lease_{all,queue}.sql) write false; a
-- queue limited later was claimed by them only while it had no slots to
-- hold. Leases existing now keep true.
ALTER TABLE pgwake.leased_jobs ADD COLUMN holds_slot boolean NOT NULL DEFAULT true;

DROP TRIGGER leased_jobs_release_slots ON pgwake.leased_jobs;
DROP FUNCTION pgwake.release_queue_slots();

-- Fenced by the token, which is never reused: a second release of the same
-- lease matches nothing, so it can never free a slot another run holds
-- (solid_queue's issue #761). Every way a lease ends (done, retry, bury,
-- rescue, cancel) deletes its row, so no code path can forget.
CREATE FUNCTION pgwake.release_queue_slot() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE pgwake.queue_slots SET lease_token = NULL WHERE lease_token = OLD.token;
    RETURN NULL;
END
$$;
CREATE TRIGGER leased_jobs_release_slot
    AFTER DELETE ON pgwake.leased_jobs
    FOR EACH ROW WHEN (OLD.holds_slot)
    EXECUTE FUNCTION pgwake.release_queue_slot();
