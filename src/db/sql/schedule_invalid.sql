-- Schedules this worker cannot evaluate (expression or zone): record why;
-- they are not served until redefined.
UPDATE pgwake.schedules s SET error = u.error
FROM unnest($1::text[], $2::text[]) AS u(name, error)
WHERE s.name = u.name
