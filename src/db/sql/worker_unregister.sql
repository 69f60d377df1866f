-- This worker stops (pgwake.workers, migration 0016).
DELETE FROM pgwake.workers WHERE id = $1
