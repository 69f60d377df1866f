-- Cancel one job ($1): what became of it, as text (functions/cancel.sql).
SELECT pgwake.cancel($1::bigint)
