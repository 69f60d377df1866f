-- Doctor: the roles pgwake's workers connect as: those given
-- pgwake.grant_worker (pgwake.role_grants), and those of the sessions of
-- live workers (their application_name, with the -listener and -ledger
-- suffixes), at most 20.
SELECT DISTINCT role FROM (
    SELECT r.rolname::text AS role FROM pgwake.role_grants g JOIN pg_roles r ON r.oid = g.role
    WHERE g.kind = 'worker'
    UNION ALL
    SELECT a.usename::text FROM pg_stat_activity a
    JOIN pgwake.live_workers w
      ON a.application_name IN (w.application_name, w.application_name || '-listener',
                                w.application_name || '-ledger')
    WHERE a.usename IS NOT NULL
) r
ORDER BY role
LIMIT 20
