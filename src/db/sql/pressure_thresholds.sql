-- The thresholds of pgwake.pressure(), as set.
SELECT to_jsonb(s) - 'singleton' FROM pgwake.pressure_settings s
