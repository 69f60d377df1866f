-- Remove a schedule; true if it existed.
SELECT pgwake.schedule_remove($1::text)
