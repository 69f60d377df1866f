-- The rescuer's sweep of held ordering keys (functions/keys.sql,
-- pgwake.release_stalled_keys): the keys noted for a recheck, then up to
-- $2 keys that have held jobs, from after key $1 (NULL: the first). Returns
-- the jobs released by each part and the key to go on from next time.
SELECT rechecked, stalled, next_after FROM pgwake.release_stalled_keys($1::text, $2::int8)
