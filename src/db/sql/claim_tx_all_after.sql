-- tx-mode claim over every queue but those claimed by other specs ($2), of
-- the jobs after ($5 priority, $6 run_at, $7 id) in claim order
-- (src/claim/choose/cursor.rs: under database pressure, claims resume after the
-- last job claimed instead of walking the head of the claim index, where
-- the entries of jobs claimed while the vacuum horizon is held stay).
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks.
-- Returns what claim_tx_all.sql returns.
SELECT * FROM pgwake.claim_tx_all_after($1::int8, $2::text[], $3::text[], $4::text[], $5::int4, $6::timestamptz, $7::int8)
