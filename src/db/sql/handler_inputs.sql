-- What an exec command or a persistent process gets of each job in $1
-- besides its payload (src/steps.rs, `inputs`): its recorded steps, as a
-- JSON object by step name (NULL when it has none), and what its parents
-- left it (pgwake.parent_results, NULL when it has no parents). One row
-- per job, by the primary key of job_steps and job_parents_child_idx.
SELECT j.id,
       (SELECT jsonb_object_agg(s.name, s.output) FROM pgwake.job_steps s
        WHERE s.job_id = j.id)::text,
       CASE WHEN EXISTS (SELECT 1 FROM pgwake.job_parents e WHERE e.child = j.id)
            THEN pgwake.parent_results(j.id)::text END
FROM unnest($1::int8[]) AS j(id)
