-- pgwake schema, version 45: when a flow's child was released (issue 37,
-- item 5: release latency; functions/flows.sql, functions/claims.sql;
-- docs/src/metrics.md → pgwake_flow_release_latency_seconds).
--
-- * `pgwake.jobs.released_at`: when the end of its last parent released a
--   held child (pgwake.end_parent_edges, at the parent's commit); NULL for
--   every other job. Each claim returns, as its last column (`release_s`),
--   the seconds from it (or from run_at, when later) to the claim, and the
--   worker observes the histogram from that column: no statement more, and
--   a job without parents carries one NULL.
-- * `pgwake.leased_jobs.released_at`: the same, carried by a lease claim's
--   move so that its RETURNING has it.
-- A retry, a hand-back, a snooze or a sleep puts the job back without it
-- (those writes list their columns): a release is observed at the child's
-- first claim after it. A tx-mode run that was lost (its claim transaction
-- rolled back) leaves the row as it was: the next claim observes it again.
--
-- Cost: two nullable columns without a default (no rewrite), brief ACCESS
-- EXCLUSIVE locks on pgwake.jobs and pgwake.leased_jobs. The claim
-- functions gain a result column: dropped here and created again from
-- functions/claims.sql right after the migrations (CREATE OR REPLACE cannot
-- change a result type), as at version 20; a worker that claims between the
-- two gets an error and claims again at its next poll. Older workers read
-- the claims' columns by position: one more at the end changes nothing for
-- them. Number 44 is another branch's.
ALTER TABLE pgwake.jobs ADD COLUMN IF NOT EXISTS released_at timestamptz;
ALTER TABLE pgwake.leased_jobs ADD COLUMN IF NOT EXISTS released_at timestamptz;

DROP FUNCTION IF EXISTS pgwake.claim_tx_all(bigint, text[], text[], text[]);
DROP FUNCTION IF EXISTS pgwake.claim_tx_all_after(bigint, text[], text[], text[], integer,
                                                  timestamptz, bigint);
DROP FUNCTION IF EXISTS pgwake.claim_tx_queue(bigint, text, text[], text[]);
DROP FUNCTION IF EXISTS pgwake.claim_lease_all(bigint, text[], text[], text[], text,
                                               double precision, bigint);
DROP FUNCTION IF EXISTS pgwake.claim_lease_all_after(bigint, text[], text[], text[], text,
                                                     double precision, bigint, integer,
                                                     timestamptz, bigint);
DROP FUNCTION IF EXISTS pgwake.claim_lease_queue(bigint, text, text[], text[], text,
                                                 double precision, bigint);
-- What creates them again is applied whatever text was recorded for it
-- (a schema whose record already holds this claims.sql would otherwise be
-- left without its claims).
DELETE FROM pgwake.schema_definitions WHERE name = 'claims.sql';
