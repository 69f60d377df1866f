-- Job $1's parents and children (migration 0039, functions/flows.sql;
-- `pgwake job show` and the console's job page): at most $2 of each, by
-- id, each with its task and where it is, the edge's policy and state, and
-- how many edges there are on each side. Found by the edges' keys (the
-- primary key's prefix for children, job_parents_child_idx for parents),
-- each job looked up by id: no scan of the queue.
--
-- Where a job is: `running` (leased, or held by a worker's claim
-- transaction), `held` (waiting for its own parents), `scheduled`,
-- `waiting`, `dead`, `cancelled`; gone from the queue, its newest history
-- row's outcome; gone without history, `done` for a parent whose edge
-- ended done without an error, `unknown` otherwise.
WITH e AS (
    (SELECT 'parent'::text AS side, p.parent AS id, p.on_failure, p.state AS edge, p.error
     FROM pgwake.job_parents p WHERE p.child = $1 ORDER BY p.parent LIMIT $2)
    UNION ALL
    (SELECT 'child'::text, p.child, p.on_failure, p.state, p.error
     FROM pgwake.job_parents p WHERE p.parent = $1 ORDER BY p.child LIMIT $2)
)
SELECT e.side, e.id, coalesce(j.task, l.task, d.task, f.task),
       CASE WHEN l.id IS NOT NULL THEN 'running'
            WHEN j.id IS NOT NULL THEN
                CASE WHEN j.xmax IN (SELECT pl.transactionid FROM pg_locks pl
                                     WHERE pl.locktype = 'transactionid' AND pl.granted)
                          AND pgwake.held_by_claim(j.xmax) THEN 'running'
                     WHEN j.parents_open > 0 THEN 'held'
                     WHEN j.run_at > now() THEN 'scheduled'
                     ELSE 'waiting' END
            WHEN d.id IS NOT NULL THEN
                CASE WHEN d.last_error = 'cancelled' THEN 'cancelled' ELSE 'dead' END
            WHEN f.outcome IS NOT NULL THEN f.outcome
            WHEN e.side = 'parent' AND e.edge = 'done' AND e.error IS NULL THEN 'done'
            ELSE 'unknown' END,
       e.on_failure, e.edge,
       (SELECT count(*) FROM pgwake.job_parents c WHERE c.child = $1),
       (SELECT count(*) FROM pgwake.job_parents c WHERE c.parent = $1)
FROM e
LEFT JOIN pgwake.jobs j ON j.id = e.id
LEFT JOIN pgwake.leased_jobs l ON l.id = e.id
LEFT JOIN pgwake.dead_jobs d ON d.id = e.id
LEFT JOIN LATERAL (SELECT x.task, x.outcome FROM pgwake.finished_jobs x
                   WHERE x.id = e.id AND j.id IS NULL AND l.id IS NULL AND d.id IS NULL
                   ORDER BY x.finished_at DESC LIMIT 1) f ON true
ORDER BY e.side DESC, e.id
