-- pgwake schema, version 11: two costs of queue settings (migration 0009)
-- taken off the claims of jobs that use none: a lease frees its queue slot
-- by a row-level trigger that fires only for leases that hold one, and the
-- one-queue claims check pause and limits with a function the planner does
-- not plan again on every claim.
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

-- Whether the plain claims may take jobs of `queue`: no row of
-- pgwake.queues pauses or limits it (a limited queue is claimed by
-- src/sql/claim_*_limited.sql). src/sql/claim_{tx,lease}_queue.sql call it
-- with the queue as a parameter: a call without columns and not volatile is
-- a one-time filter of the claim, evaluated once, in the claim's snapshot
-- (STABLE), as the NOT EXISTS subquery it replaces was. That subquery was
-- planned on every claim (the claims use custom plans, ARCHITECTURE.md →
-- "The limit is hidden from the planner"): 0.02–0.03 ms of the 0.14 ms a
-- one-job claim took to plan; PL/pgSQL plans its query once per session.
CREATE FUNCTION pgwake.queue_claimable(queue text) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN NOT EXISTS (SELECT FROM pgwake.queues q
                       WHERE q.name = queue
                         AND (q.paused OR q.max_running IS NOT NULL OR q.rate_count IS NOT NULL));
END
$$;
