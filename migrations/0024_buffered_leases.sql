-- pgwake schema, version 24: a job that waited in a worker's prefetch
-- buffer is not charged for that worker's crash (issue 33, item 1;
-- ARCHITECTURE.md → "Lease prefetch").
--
-- `leased_jobs.buffered`: the lease claim took this job ahead of the
-- worker's free slots (it went into the prefetch buffer, not straight to a
-- slot). When such a lease expires (its worker died or lost the database),
-- the rescuer cannot tell whether the job had started: it puts it back
-- with the attempt refunded and marks it a suspect.
--
-- `jobs.suspect` (and `leased_jobs.suspect`, carried through a lease): a
-- job refunded that way. A suspect is never claimed ahead of the free
-- slots (claims for the buffer alone skip it, and a claim for free slots
-- ranks suspects first, onto the slots), so its next crash, if it is the
-- job that kills its workers, is charged like any running job's. A retry
-- clears it.
--
-- Cost of this migration: three columns with constant defaults, which
-- PostgreSQL adds without rewriting either table; each ALTER takes its
-- table's lock briefly (lock_timeout and retry, src/admin/schema.rs).
ALTER TABLE pgwake.jobs ADD COLUMN suspect boolean NOT NULL DEFAULT false;
ALTER TABLE pgwake.leased_jobs
    ADD COLUMN suspect boolean NOT NULL DEFAULT false,
    ADD COLUMN buffered boolean NOT NULL DEFAULT false;
