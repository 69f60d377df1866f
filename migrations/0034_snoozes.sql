-- pgwake schema, version 34: snoozes (issue 37, item 1).
-- A handler may put its job back for a while without using an attempt
-- (`Outcome::Snooze`, exec's `pgwake-snooze:` line, a persistent handler's
-- `snooze` message, a sql handler's `snooze` result). Each snooze is
-- counted here, one row per job that ever snoozed, written only by a
-- snooze (in the statement or claim transaction that puts the job back):
-- jobs that never snooze never touch this table, and no claim reads it.
--
--   snoozes        how many times the job snoozed, in all
--   snoozed_until  the run_at its last snooze gave it (`pgwake explain`
--                  says "snoozed" while the job waits with this run_at)
--   snoozed_at     when it last snoozed
--
-- Not a column of pgwake.jobs: a tx-mode claim deletes the row and its
-- handler's outcome inserts it again from what the claim returned, and the
-- claim functions' result type would have to change to carry a count
-- (ARCHITECTURE.md, "Snoozes"). Rows of jobs that are gone expire in the
-- rescuer's round a week after their last snooze (src/db/sql/snoozes_expire.sql).
--
-- Cost: a new, empty table. Number 33 is another branch's.

CREATE TABLE IF NOT EXISTS pgwake.job_snoozes (
    job_id        bigint PRIMARY KEY,
    snoozes       integer NOT NULL,
    snoozed_until timestamptz NOT NULL,
    snoozed_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS job_snoozes_at_idx ON pgwake.job_snoozes (snoozed_at);
