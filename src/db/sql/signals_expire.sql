-- Kept signals (migration 0042) past their keep_until and, past the newest
-- 100,000, the oldest: at most 10,000 of each a rescue round.
DELETE FROM pgwake.signals
WHERE ctid = ANY (ARRAY(
    (SELECT s.ctid FROM pgwake.signals s WHERE s.keep_until <= now() LIMIT 10000)
    UNION ALL
    (SELECT s.ctid FROM pgwake.signals s ORDER BY s.sent_at DESC OFFSET 100000 LIMIT 10000)))
