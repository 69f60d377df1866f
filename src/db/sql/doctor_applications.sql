-- Doctor: client sessions per application and role, every database, the
-- $1 largest groups (the connection budget's details).
SELECT coalesce(nullif(application_name, ''), '(no application_name)') AS application,
       coalesce(usename::text, '') AS role, count(*)::int8 AS sessions
FROM pg_stat_activity
WHERE backend_type = 'client backend'
GROUP BY 1, 2
ORDER BY 3 DESC, 1, 2
LIMIT $1
