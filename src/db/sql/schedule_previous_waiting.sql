-- Which of these previous jobs of schedules are still waiting to start? A
-- job is waiting when its row is in pgwake.jobs and no claim holds it: a
-- running tx-mode job's row is locked by its claim (skipped here), a running
-- lease-mode job has moved to pgwake.leased_jobs, a finished one is gone. A
-- job waiting for a retry counts as waiting. The lock lasts until the
-- scheduler's commit (milliseconds); a claim meanwhile skips the row and
-- takes it on its next round.
SELECT id FROM pgwake.jobs WHERE id = ANY($1::bigint[]) FOR UPDATE SKIP LOCKED
