-- lease-mode claim from one queue ($2), in claim order on
-- jobs_queue_ready_idx (which leaves out held jobs).
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks,
-- $5: worker id, $6: lease seconds.
--
-- Moves the jobs into pgwake.leased_jobs in one autocommit statement, with
-- this attempt counted and a fresh claim token (never reused: every later
-- write of this run is fenced by it). The query is the function's
-- (migration 0012), planned once per session.
SELECT * FROM pgwake.claim_lease_queue($1::int8, $2::text, $3::text[], $4::text[], $5::text, $6::float8)
