-- The rescuer's sweep of the key slots of keys that have no job left
-- (functions/rescue.sql, pgwake.sweep_key_slots): up to $3 keys, from after
-- key ($1, $2) (NULL: the first). Returns the rows deleted and the key to go
-- on from next time (NULL: start over).
SELECT swept, next_queue, next_key FROM pgwake.sweep_key_slots($1::text, $2::text, $3::int8)
