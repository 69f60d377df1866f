-- Give back admissions a claim did not use (src/db/sql/rate_reserve.sql): $1
-- the queue, $2 the slots, $3 their admission time. Only a slot still
-- holding that admission gets its previous one back; none can have been
-- reused meanwhile (its admission is younger than a window), so this is
-- exactly as if the slot had not been taken.
UPDATE pgwake.queue_rate_slots
SET last_start = prev_start
WHERE queue = $1::text AND slot = ANY($2::int4[]) AND last_start = $3::timestamptz
