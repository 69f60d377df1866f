-- tx-mode claim from one queue ($2), of the jobs after ($5 priority, $6
-- run_at, $7 id) in the queue's claim order (src/claim/choose/cursor.rs:
-- under database pressure, a claim of one queue resumes after the last job
-- claimed from it instead of walking the head of its range of
-- jobs_queue_ready_idx, where the entries of jobs claimed while the vacuum
-- horizon is held stay).
-- $1: limit, $3: only these tasks (NULL: any), $4: never these tasks.
-- Returns what claim_tx_queue.sql returns.
SELECT * FROM pgwake.claim_tx_queue_after($1::int8, $2::text, $3::text[], $4::text[], $5::int4, $6::timestamptz, $7::int8)
