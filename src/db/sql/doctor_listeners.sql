-- Doctor: sessions that may hold the NOTIFY queue: those whose last
-- statement was a LISTEN, and those in a transaction (a session in a
-- transaction reads no notification until it ends), oldest first, at most
-- $1. Which session's position holds the queue's tail is not shown by the
-- server; these are the candidates.
SELECT pid, coalesce(nullif(application_name, ''), backend_type) AS who,
       coalesce(state, '') AS state,
       greatest(0, extract(epoch FROM now() - coalesce(xact_start, state_change, backend_start)))::float8
           AS age,
       left(query, 200) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'
  AND (query ILIKE 'listen%' OR state LIKE 'idle in transaction%')
ORDER BY coalesce(xact_start, state_change, backend_start), pid
LIMIT $1
