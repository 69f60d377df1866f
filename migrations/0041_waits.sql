-- pgwake schema, version 41: waits (issue 37, item 4).
-- A handler may put its job to sleep until a time without using an
-- attempt (`Outcome::Sleep`). Each job's last wait is recorded here, one
-- row per job that ever waited, written only by a sleep (in the statement
-- or claim transaction that puts the job back): jobs that never wait never
-- touch this table, and no claim reads it. The sleeping job itself is an
-- ordinary row of pgwake.jobs with run_at in the future: out of the claim
-- path (the claims take due jobs only), holding no slot of any limit.
--
--   kind        'sleep' (the one kind so far)
--   wait_until  the run_at its last wait gave it (`pgwake explain` says
--               "sleeping until …" while the job waits with this run_at)
--   waited_at   when it last began to wait
--   waits       how many times it waited, in all
--
-- Not a column of pgwake.jobs, for the reasons of pgwake.job_snoozes
-- (migration 0034; ARCHITECTURE.md, "Snoozes"). Rows of jobs that are gone
-- expire in the rescuer's round a week after their last wait
-- (src/db/sql/waits_expire.sql).
--
-- Cost: a new, empty table. Numbers 39 and 40 are other branches'.

CREATE TABLE IF NOT EXISTS pgwake.job_waits (
    job_id     bigint PRIMARY KEY,
    kind       text NOT NULL,
    wait_until timestamptz NOT NULL,
    waited_at  timestamptz NOT NULL DEFAULT now(),
    waits      integer NOT NULL
);
CREATE INDEX IF NOT EXISTS job_waits_at_idx ON pgwake.job_waits (waited_at);
