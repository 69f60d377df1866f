-- Fair claims over every queue (src/claim/choose/fair.rs): the queues that have a ready
-- job, but those in $1 and paused ones, at most $2. The query is in the
-- function pgwake.ready_queues (migration 0013), which plans it once per
-- session: a loose scan of jobs_queue_ready_idx (jobs that are not held,
-- migration 0017) for the distinct queues (one probe per distinct queue,
-- however deep each queue is), each kept if
-- a job of it is ready (a range of the same index, stopping at the first
-- ready row).
SELECT queue FROM pgwake.ready_queues($1::text[], $2::int8)
