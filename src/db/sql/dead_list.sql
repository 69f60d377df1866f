-- Dead jobs, newest first, optionally of one queue. The payload as text:
-- shown as stored, whatever it holds (even one too deep to decode).
SELECT id, queue, task, payload::text, attempts, max_attempts, last_error, failed_at
FROM pgwake.dead_jobs
WHERE $1::text IS NULL OR queue = $1
ORDER BY failed_at DESC, id DESC
LIMIT $2
