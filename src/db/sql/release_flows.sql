-- The rescuer's sweep of jobs held for their parents (functions/flows.sql,
-- pgwake.release_stalled_flows): settles again the ended parents of up to
-- $2 held children from after child id $1 (NULL: the first). Returns the
-- children released (missed releases) and the id to go on from.
SELECT released, next_after FROM pgwake.release_stalled_flows($1::int8, $2::int8)
