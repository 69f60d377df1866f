-- Admissions for a claim of a queue with a per-key rate (migration 0021),
-- in their own autocommit statement just before the claim: $1 the queue,
-- $2 the last limit key this worker served of it, $3 most admissions
-- wanted, $4 only these tasks (NULL: any), $5 never these tasks, $6 the one
-- job of a suspect's claim (NULL: none). See pgwake.reserve_key_admissions
-- (functions/claims.sql).
SELECT queue_name, rated, keys, slots, admitted_at, next_free, stop_key
FROM pgwake.reserve_key_admissions($1::text, $2::text, $3::int8, $4::text[], $5::text[], $6::int8)
