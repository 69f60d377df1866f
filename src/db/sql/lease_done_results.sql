-- Lease-mode jobs done, history off, some with results: remove their
-- leases fenced by claim token ($1), and keep the results ($2, JSON text or
-- NULL) of those with children on their edges to the children that wait
-- (migration 0043), in the same statement: the results commit with the
-- parents' ends, and so with the children's release. Returns the tokens
-- that matched.
WITH u AS (
    SELECT * FROM unnest($1::bigint[], $2::text[]) AS u(token, result)
),
done AS (
    DELETE FROM pgwake.leased_jobs l USING u WHERE l.token = u.token
    RETURNING l.id, l.token, l.has_children, u.result
),
kept AS (
    UPDATE pgwake.job_parents e SET result = d.result::jsonb
    FROM done d
    WHERE d.has_children AND d.result IS NOT NULL AND e.parent = d.id AND e.state = 'open'
)
SELECT token FROM done
