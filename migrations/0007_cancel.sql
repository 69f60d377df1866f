-- pgwake schema, version 7: cancellation (`pgwake cancel`, pgwake.cancel()).
--
-- A cancel of a running job is a row here plus a NOTIFY on the control
-- channel `pgwake_control`. The notification is the fast path; the row is
-- what cannot be lost: every worker checks it, on an interval and after each
-- listener reconnect, for the jobs it runs. A request stays until the job
-- has been cancelled (or has finished: orphans are removed after a while,
-- and `pgwake dead retry` removes the requests of the jobs it revives).
CREATE TABLE pgwake.cancel_requests (
    job_id       bigint      PRIMARY KEY,
    requested_at timestamptz NOT NULL DEFAULT now()
);
