-- `pgwake stats`: lease-mode jobs in flight per queue (running, or whose
-- worker died and whose lease the rescuer has not moved back yet), and how
-- many of those leases have expired. pgwake.leased_jobs holds only jobs in
-- flight, so this stays small.
SELECT queue, count(*)::int8, count(*) FILTER (WHERE lease_until < now())::int8
FROM pgwake.leased_jobs
GROUP BY queue
