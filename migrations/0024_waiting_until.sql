-- pgwake schema, version 24: the insert trigger's common case, no worker
-- waiting, reads a sequence instead of querying pgwake.waiting_workers
-- (issue 22; ARCHITECTURE.md → "NOTIFY only when a worker is waiting").
--
-- pgwake.waiting_until holds, in milliseconds since the Unix epoch, a time
-- no live registration outlives: every registration (an insert or update
-- of pgwake.waiting_workers, by a worker of any version) raises it to its
-- own expires_at, through the trigger below. When it is in the past, no
-- registration can be live and the insert trigger returns without a query
-- (pg_sequence_last_value: a function call, no table scan). Deleting a
-- registration leaves it as it is: the trigger then queries the table, as
-- before, until the time passes. A sequence is not transactional: a
-- registration that rolls back leaves it raised, which only sends the
-- trigger down the querying path.
--
-- Cost of this migration: none (a sequence, a trigger on an UNLOGGED table
-- of a few rows).
CREATE SEQUENCE IF NOT EXISTS pgwake.waiting_until AS bigint MINVALUE 0 START 0;
-- The value is a time; every role that inserts jobs reads it through the
-- insert trigger, including producer roles granted before this version.
GRANT SELECT ON SEQUENCE pgwake.waiting_until TO PUBLIC;
-- Registrations live now (workers of the previous version keep running
-- during an upgrade).
SELECT setval('pgwake.waiting_until',
              coalesce((SELECT max(CASE WHEN expires_at = 'infinity' THEN 9223372036854775807
                                        WHEN expires_at = '-infinity' THEN 0
                                        ELSE ceil(date_part('epoch', expires_at) * 1000)::bigint END)
                        FROM pgwake.waiting_workers), 0));
