-- Add (or with $9 replace) a schedule through the SQL API, which validates
-- every argument and raises 22023 "field: reason" or 23505 for a taken name.
SELECT pgwake.schedule_add(
    name => $1::text, cron => $2::text, task => $3::text, payload => $4::jsonb,
    queue => $5::text, priority => $6::int, tz => $7::text, catch_up => $8::text,
    replace => $9::boolean)
