-- Done: remove the leased row, fenced by (id, attempt) so a late worker
-- cannot complete a job that was rescued and claimed again.
DELETE FROM pgwake.leased_jobs WHERE id = $1 AND attempts = $2
