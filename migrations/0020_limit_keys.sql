-- pgwake schema, version 20: a job's limit key (issue 24, tenants;
-- ARCHITECTURE.md → "Limit keys").
--
-- `limit_key` names who a job is for (a customer, a tenant) for the
-- per-key settings of its queue: fairness between keys (`fair_keys`). NULL:
-- the job has no key and no per-key setting applies to it. It travels with
-- the job through every table it passes (leased, dead, finished), so a
-- retry or a revived dead job keeps it. A producer sets it
-- (pgwake.enqueue(…, limit_key => …), the client, the CLI, a plain INSERT),
-- or the queue derives it from the payload: `limit_key_path` names a
-- top-level payload field, and an insert trigger fills a job's NULL key
-- with `payload ->> limit_key_path`.
--
-- Cost of this migration: columns without a default (no rewrite) and one
-- partial index built over the keyed jobs (none before this version: an
-- empty index, built in one pass of pgwake.jobs).

ALTER TABLE pgwake.jobs ADD COLUMN limit_key text;
ALTER TABLE pgwake.leased_jobs ADD COLUMN limit_key text;
ALTER TABLE pgwake.dead_jobs ADD COLUMN limit_key text;
ALTER TABLE pgwake.finished_jobs ADD COLUMN limit_key text;
-- As the other keys (migration 0014): the index refuses longer entries
-- with an error naming the index, not the limit. NOT VALID: no scan.
ALTER TABLE pgwake.jobs
    ADD CONSTRAINT jobs_limit_key_length CHECK (octet_length(limit_key) <= 1024) NOT VALID;

-- Per-queue settings. `limit_key_path`: the payload field a NULL limit
-- key is taken from. `fair_keys`: claims of the queue take its ready jobs
-- in rotation between limit keys (src/db/sql/claim_*_fair_keys.sql).
ALTER TABLE pgwake.queues
    ADD COLUMN limit_key_path text
        CONSTRAINT queues_limit_key_path_valid
        CHECK (limit_key_path <> '' AND octet_length(limit_key_path) <= 200
               AND limit_key_path !~ '[[:cntrl:]]'),
    ADD COLUMN fair_keys boolean NOT NULL DEFAULT false;

-- The keyed ready jobs of a queue, key by key, each key's in claim order:
-- the fair-keys claims skip from key to key on it.
-- Keys in byte order (COLLATE "C"): a worker keeps where its rotation
-- stands and compares keys the same way.
CREATE INDEX jobs_limit_key_ready_idx
    ON pgwake.jobs (queue, limit_key COLLATE "C", priority, run_at, id)
    WHERE NOT held AND limit_key IS NOT NULL;

-- The insert trigger's function as functions/queues.sql first defines it
-- (migrate then applies that file, which holds the current one).
CREATE FUNCTION pgwake.fill_limit_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    NEW.limit_key := NEW.payload ->> (SELECT q.limit_key_path FROM pgwake.queues q
                                      WHERE q.name = NEW.queue);
    RETURN NEW;
END
$$;
-- Its trigger, jobs_fill_limit_key, is created by the first
-- pgwake.set_queue_limit_key_path (functions/queues.sql), not here: it runs
-- for every insert without a key, which doubled the time of a bulk insert
-- of 100,000 jobs without keys (6.5 s against 3.5 s, 2 busy cores), a cost
-- only installations that use a path should pay.

-- Functions whose arguments or result columns gain the limit key: the new
-- definitions (functions/) are applied right after this migration; CREATE
-- OR REPLACE cannot change a result type, and a new argument would make a
-- second function beside the old one.
DROP FUNCTION IF EXISTS pgwake.enqueue(text, jsonb, text, timestamptz, integer, integer, interval, text,
                                       text, boolean);
DROP FUNCTION IF EXISTS pgwake.enqueue_unique(text, jsonb, text, timestamptz, integer, integer, interval,
                                              text, text, boolean);
DROP FUNCTION IF EXISTS pgwake.claim_tx_all(bigint, text[], text[], text[]);
DROP FUNCTION IF EXISTS pgwake.claim_tx_queue(bigint, text, text[], text[]);
DROP FUNCTION IF EXISTS pgwake.claim_lease_all(bigint, text[], text[], text[], text, double precision);
DROP FUNCTION IF EXISTS pgwake.claim_lease_queue(bigint, text, text[], text[], text, double precision);

-- Per-key running limits: at most `max_running_per_key` jobs of one limit
-- key of the queue run at once across every worker (NULL: no limit), or the
-- key's own limit in pgwake.queue_key_limits (`pgwake queue set Q --key K
-- --max-running N`). `key_limits`: the queue has either (kept by the
-- setting functions, so the claims' filters read one column).
ALTER TABLE pgwake.queues
    ADD COLUMN max_running_per_key integer
        CONSTRAINT queues_max_running_per_key_valid CHECK (max_running_per_key BETWEEN 1 AND 100000),
    ADD COLUMN key_limits boolean NOT NULL DEFAULT false;
CREATE TABLE pgwake.queue_key_limits (
    queue       text    NOT NULL REFERENCES pgwake.queues (name) ON DELETE CASCADE,
    limit_key   text    NOT NULL,
    max_running integer NOT NULL CHECK (max_running BETWEEN 1 AND 100000),
    PRIMARY KEY (queue, limit_key)
);
-- One row per running-job slot of a key, 1..its limit, as pgwake.queue_slots
-- is per queue: a tx-mode claim holds one by its row lock until its
-- transaction ends, a lease-mode claim by writing its claim token into
-- lease_token (freed by the trigger below when the lease row goes). Rows
-- above the limit (a lowered one) block new starts of the key until they
-- are free, and are then deleted.
CREATE TABLE pgwake.key_slots (
    queue       text    NOT NULL,
    limit_key   text    NOT NULL,
    slot        integer NOT NULL CHECK (slot > 0),
    lease_token bigint,
    PRIMARY KEY (queue, limit_key, slot)
);
CREATE INDEX key_slots_lease_token_idx ON pgwake.key_slots (lease_token)
    WHERE lease_token IS NOT NULL;
-- Leases that hold a key slot; only their end runs the trigger.
ALTER TABLE pgwake.leased_jobs ADD COLUMN holds_key_slot boolean NOT NULL DEFAULT false;

-- As functions/queues.sql first defines them.
CREATE FUNCTION pgwake.release_key_slot() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    UPDATE pgwake.key_slots SET lease_token = NULL WHERE lease_token = OLD.token;
    RETURN NULL;
END
$$;
CREATE TRIGGER leased_jobs_release_key_slot
    AFTER DELETE ON pgwake.leased_jobs
    FOR EACH ROW WHEN (OLD.holds_key_slot)
    EXECUTE FUNCTION pgwake.release_key_slot();
CREATE FUNCTION pgwake.add_key_slots() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pgwake AS $$
BEGIN
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_add_key_slots
    AFTER INSERT ON pgwake.jobs
    FOR EACH ROW WHEN (NEW.limit_key IS NOT NULL)
    EXECUTE FUNCTION pgwake.add_key_slots();
