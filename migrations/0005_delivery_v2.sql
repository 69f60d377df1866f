-- pgwake schema, version 5: delivery v2.
--
-- * Per-job timeout: `timeout` (NULL: the worker's --job-timeout), carried
--   wherever a job travels (leases, dead jobs).
-- * Lease fencing by a claim token that is never reused. (id, attempts) was
--   reused after `pgwake dead retry` reset attempts, so a stalled worker
--   could renew and complete a later run of the same job.
-- * The tx-mode crash ledger becomes durable (it was UNLOGGED, so a server
--   crash forgot the very jobs that crash servers), and a claim no longer
--   charges an attempt to every job of its batch before any runs: it writes
--   one marker row per batch (tx_batches); a batch whose claim transaction
--   ended without clearing its marker crashed, and its jobs become suspects
--   (tx_attempts) that run one at a time, each charged before it starts.

ALTER TABLE pgwake.jobs ADD COLUMN timeout interval;
ALTER TABLE pgwake.jobs ADD CONSTRAINT jobs_timeout_valid
    CHECK (timeout IS NULL OR timeout > interval '0');
ALTER TABLE pgwake.dead_jobs ADD COLUMN timeout interval;
ALTER TABLE pgwake.leased_jobs ADD COLUMN timeout interval;

CREATE SEQUENCE pgwake.claim_token_seq AS bigint;
-- Existing leases (from a worker of the previous version) keep working: the
-- rescuer moves them back when they expire.
ALTER TABLE pgwake.leased_jobs ADD COLUMN token bigint;
UPDATE pgwake.leased_jobs SET token = nextval('pgwake.claim_token_seq');
ALTER TABLE pgwake.leased_jobs ALTER COLUMN token SET NOT NULL;
ALTER TABLE pgwake.leased_jobs
    ALTER COLUMN token SET DEFAULT nextval('pgwake.claim_token_seq');
CREATE UNIQUE INDEX leased_jobs_token_idx ON pgwake.leased_jobs (token);

-- Suspects: jobs whose earlier claim ended without an outcome. `charged`
-- counts the runs that started alone and never reported (the crashes this
-- job caused); `pending` marks that it must run alone next time.
ALTER TABLE pgwake.tx_attempts SET LOGGED;
ALTER TABLE pgwake.tx_attempts RENAME COLUMN attempts TO charged;
ALTER TABLE pgwake.tx_attempts ALTER COLUMN charged SET DEFAULT 0;

-- One row per tx-mode batch in flight: written (committed) on a second
-- connection after the claim and before any handler runs, deleted by the
-- claim transaction's own commit. A row whose claim transaction (`xid`) is
-- no longer in progress marks a batch that never reported.
CREATE TABLE pgwake.tx_batches (
    token     bigint      PRIMARY KEY DEFAULT nextval('pgwake.claim_token_seq'),
    xid       xid8        NOT NULL,
    job_ids   bigint[]    NOT NULL,
    worker_id text        NOT NULL,
    claimed_at timestamptz NOT NULL DEFAULT now()
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);

-- pgwake.enqueue() gains a `timeout` argument (triggers/enqueue.sql); the
-- old six-argument version would make calls ambiguous.
-- (Checked first: DROP … IF EXISTS would print a NOTICE on a new database.)
DO $$
BEGIN
    IF to_regprocedure('pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer)') IS NOT NULL THEN
        DROP FUNCTION pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer);
    END IF;
END
$$;
