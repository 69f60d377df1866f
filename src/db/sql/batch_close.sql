-- Close batch $1 (pgwake.batch_close, functions/flows.sql): false if it was
-- closed already.
SELECT pgwake.batch_close($1)
