-- Renew every lease this worker still holds, in one statement ($1 tokens,
-- $2 lease seconds), without waiting on any row: a lease row locked by an
-- outcome write in flight (or by anyone) is skipped, reported as held but
-- not renewed (false). A token missing from the result lost its lease (it
-- expired and was rescued; the job may be running elsewhere): its run
-- stops. A held-but-not-renewed lease keeps the time it was secured until.
WITH mine AS (
    SELECT token FROM pgwake.leased_jobs
    WHERE token = ANY($1::bigint[])
    FOR UPDATE SKIP LOCKED
),
renewed AS (
    UPDATE pgwake.leased_jobs l
    SET lease_until = now() + make_interval(secs => $2)
    FROM mine WHERE l.token = mine.token
    RETURNING l.token
)
SELECT token, true AS renewed FROM renewed
UNION ALL
SELECT token, false FROM pgwake.leased_jobs
WHERE token = ANY($1::bigint[]) AND token NOT IN (SELECT token FROM mine)
