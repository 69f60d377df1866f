-- The server process of this connection (to cancel its statement from
-- another connection). Behind a transaction-mode pooler it is valid only
-- while this connection's transaction is open: read it inside one.
SELECT pg_backend_pid()
