-- The governor's recorded level, since when, and the causes at that change
-- (pgwake.pressure_state): what the console shows, read-only (a reading of
-- pgwake.pressure() may write).
SELECT level, since, causes FROM pgwake.pressure_state
