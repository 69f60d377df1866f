-- What job $1's parents left it (pgwake.parent_results, functions/flows.sql):
-- a JSON object by parent id, as text.
SELECT pgwake.parent_results($1)::text
