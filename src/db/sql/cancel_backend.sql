-- Cancel the statement server process $1 is running (a timed-out job's).
SELECT pg_cancel_backend($1)
