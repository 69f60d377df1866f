-- `pgwake pressure set`: change the thresholds of pgwake.pressure() (NULL:
-- keep); the function refuses a nonsensical set (22023) naming the range,
-- and returns every threshold as now set.
SELECT pgwake.set_pressure_thresholds(
    horizon_elevated_seconds => $1::float8,
    horizon_critical_seconds => $2::float8,
    dead_tuples_elevated => $3::bigint,
    dead_tuples_critical => $4::bigint,
    notify_elevated => $5::float8,
    notify_critical => $6::float8,
    leave_ratio => $7::float8)
