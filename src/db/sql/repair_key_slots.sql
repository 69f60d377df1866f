-- Add the missing slot rows of keys a claim reported ($2) of queue $1
-- (functions/queues.sql, pgwake.repair_key_slots), in a statement of their
-- own, never inside a claim. Returns the rows added.
SELECT pgwake.repair_key_slots($1::text, $2::text[])
