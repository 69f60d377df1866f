-- Doctor: the timeouts the roles $1 get when they connect to this database,
-- and from where: per role, the first of ALTER ROLE … IN DATABASE, ALTER
-- ROLE, ALTER DATABASE and the server (pg_db_role_setting; the server's
-- value as this session's pg_settings has it, unless this session's own
-- value came from a role or database setting, then the built-in default).
-- A row with an empty role is what every other role gets (database, then
-- server). Values as written ('5s', '5000', '1min').
WITH db AS (SELECT oid FROM pg_database WHERE datname = current_database()),
roles AS (
    SELECT oid, rolname::text AS rolname FROM pg_roles WHERE rolname = ANY($1::text[])
    UNION ALL SELECT 0, ''
),
names(name) AS (
    VALUES ('statement_timeout'), ('idle_session_timeout'),
           ('idle_in_transaction_session_timeout')
),
given AS (
    SELECT s.setdatabase, s.setrole, split_part(c, '=', 1) AS name,
           substr(c, strpos(c, '=') + 1) AS value
    FROM pg_db_role_setting s, unnest(s.setconfig) c
    WHERE s.setdatabase = 0 OR s.setdatabase = (SELECT oid FROM db)
)
SELECT r.rolname AS role, n.name,
       coalesce(rd.value, ro.value, d.value,
                CASE WHEN p.source IN ('database', 'user', 'database user', 'session', 'client')
                     THEN p.boot_val ELSE p.reset_val END) AS value,
       CASE WHEN rd.value IS NOT NULL THEN 'role in database'
            WHEN ro.value IS NOT NULL THEN 'role'
            WHEN d.value IS NOT NULL THEN 'database'
            ELSE 'server' END AS level
FROM roles r
CROSS JOIN names n
JOIN pg_settings p ON p.name = n.name
LEFT JOIN given rd ON rd.name = n.name AND r.oid <> 0 AND rd.setrole = r.oid AND rd.setdatabase <> 0
LEFT JOIN given ro ON ro.name = n.name AND r.oid <> 0 AND ro.setrole = r.oid AND ro.setdatabase = 0
LEFT JOIN given d ON d.name = n.name AND d.setrole = 0 AND d.setdatabase <> 0
ORDER BY r.rolname, n.name
