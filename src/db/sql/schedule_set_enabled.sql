-- Enable ($2 true) or disable the schedule $1; a row if it exists. Enabling
-- a disabled schedule makes it fresh from now (its first tick is the first
-- one after this moment: no catch-up of the time it was disabled).
UPDATE pgwake.schedules
SET fresh = CASE WHEN $2 AND NOT enabled THEN true ELSE fresh END,
    next_tick = CASE WHEN $2 AND NOT enabled THEN now() ELSE next_tick END,
    enabled = $2,
    updated_at = now()
WHERE name = $1
RETURNING name
