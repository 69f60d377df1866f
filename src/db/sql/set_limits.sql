-- The claim transaction's idle and statement limits, $1 milliseconds; for
-- this transaction only (never the session: a pooled server connection
-- serves other clients next).
SELECT set_config('idle_in_transaction_session_timeout', $1, true),
       set_config('statement_timeout', $1, true)
