-- A traced sql handler's call (src/handlers/sql.rs): the run's W3C context
-- as the transaction-local settings a producer sets (functions/traces.sql),
-- which the function may read and which jobs it enqueues take. Emptied
-- ('', '') after the call in tx mode.
SELECT set_config('pgwake.traceparent', $1, true), set_config('pgwake.tracestate', $2, true)
