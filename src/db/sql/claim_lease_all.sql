-- lease-mode claim over every queue but those claimed by other specs ($2).
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks,
-- $5: worker id, $6: lease seconds, $7: how many go straight to free
-- slots (the rest are marked buffered; functions/claims.sql).
--
-- Moves the jobs into pgwake.leased_jobs in one autocommit statement, with
-- this attempt counted and a fresh claim token (never reused: every later
-- write of this run is fenced by it). The query is the function's
-- (migration 0012), planned once per session.
SELECT * FROM pgwake.claim_lease_all($1::int8, $2::text[], $3::text[], $4::text[], $5::text, $6::float8, $7::int8)
