-- Give back per-key admissions a claim did not use
-- (src/db/sql/key_rate_reserve.sql): $1 the queue, $2 the keys and $3 the
-- slots (pairwise), $4 their admission time. Only a slot still holding that
-- admission gets its previous one back; none can have been reused meanwhile
-- (its admission is younger than a window), so this is exactly as if the
-- slot had not been taken.
UPDATE pgwake.key_rate_slots s
SET last_start = s.prev_start
FROM unnest($2::text[], $3::int4[]) AS u(limit_key, slot)
WHERE s.queue = $1::text AND s.limit_key = u.limit_key AND s.slot = u.slot
  AND s.last_start = $4::timestamptz
