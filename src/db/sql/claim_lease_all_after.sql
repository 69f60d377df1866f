-- lease-mode claim over every queue but those claimed by other specs ($2),
-- of the jobs after ($8 priority, $9 run_at, $10 id) in claim order
-- (src/claim/choose/cursor.rs: under database pressure, claims resume after the
-- last job claimed instead of walking the head of the claim index, where
-- the entries of jobs claimed while the vacuum horizon is held stay).
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks,
-- $5: worker id, $6: lease seconds, $7: how many go straight to free slots.
-- Returns what claim_lease_all.sql returns.
SELECT * FROM pgwake.claim_lease_all_after($1::int8, $2::text[], $3::text[], $4::text[], $5::text, $6::float8, $7::int8,
                                           $8::int4, $9::timestamptz, $10::int8)
