-- tx mode: keep the results of the batch's done jobs ($1 ids, $2 results,
-- JSON text) on their edges to children that wait (migration 0043), in the
-- claim transaction: they commit with the jobs' ends, and so with the
-- children's release. A job without children matches no edge.
UPDATE pgwake.job_parents e SET result = u.result::jsonb
FROM unnest($1::bigint[], $2::text[]) AS u(parent, result)
WHERE e.parent = u.parent AND e.state = 'open' AND u.result IS NOT NULL
