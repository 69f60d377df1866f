-- Remove cancel requests whose job has finished (in neither pgwake.jobs nor
-- pgwake.leased_jobs, in one snapshot: a job moving between the two is in
-- one of them). Only requests older than ten minutes: a lease-mode job is
-- already out of leased_jobs when its request is made, and the worker that
-- runs it must still find the request on its next poll.
DELETE FROM pgwake.cancel_requests r
WHERE r.requested_at < now() - interval '10 minutes'
  AND NOT EXISTS (SELECT 1 FROM pgwake.jobs j WHERE j.id = r.job_id)
  AND NOT EXISTS (SELECT 1 FROM pgwake.leased_jobs l WHERE l.id = r.job_id)
