-- Lease-mode claim from one queue ($2), of the jobs after ($8 priority, $9
-- run_at, $10 id) in the queue's claim order (src/claim/choose/cursor.rs:
-- under database pressure, a claim of one queue resumes after the last job
-- claimed from it instead of walking the head of its range of
-- jobs_queue_ready_idx, where the entries of jobs claimed while the vacuum
-- horizon is held stay).
-- Returns what claim_lease_queue.sql returns.
SELECT * FROM pgwake.claim_lease_queue_after($1::int8, $2::text, $3::text[], $4::text[], $5::text, $6::float8, $7::int8,
                                             $8::int4, $9::timestamptz, $10::int8)
