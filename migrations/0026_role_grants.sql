-- pgwake schema, version 26: the roles given pgwake's grants
-- (`pgwake.grant_producer|worker|monitor`, functions/roles.sql) are recorded,
-- so that `pgwake migrate` re-applies them after every upgrade: a migration
-- that adds a table or a function no longer leaves least-privilege roles
-- without grants (issue 33, item 13).
--
-- `role` is the role's OID: a renamed role keeps its grants, a dropped one
-- is forgotten (migrate skips and deletes its rows). To stop re-granting a
-- role: DELETE FROM pgwake.role_grants WHERE role = 'app'::regrole.
--
-- Cost of this migration: a new table, no lock on the queue tables.
CREATE TABLE pgwake.role_grants (
    role       oid         NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('producer', 'worker', 'monitor')),
    granted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (role, kind)
);

-- Roles granted before this version, recognised by what the grant
-- functions gave them directly (not through membership): DELETE on
-- pgwake.jobs is a worker's, INSERT without DELETE a producer's, SELECT on
-- pgwake.dead_jobs without INSERT on pgwake.jobs a monitor's. The owner
-- and PUBLIC are not roles to grant.
INSERT INTO pgwake.role_grants (role, kind)
SELECT grantee, kind
FROM (
    SELECT a.grantee,
           CASE
               WHEN bool_or(a.privilege_type = 'DELETE') THEN 'worker'
               WHEN bool_or(a.privilege_type = 'INSERT') THEN 'producer'
           END AS kind
    FROM pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = 'pgwake.jobs'::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner
    GROUP BY a.grantee
    UNION ALL
    SELECT a.grantee, 'monitor'
    FROM pg_class c, aclexplode(c.relacl) a
    WHERE c.oid = 'pgwake.dead_jobs'::regclass AND a.grantee <> 0 AND a.grantee <> c.relowner
      AND a.privilege_type = 'SELECT'
      AND NOT EXISTS (SELECT 1 FROM pg_class j, aclexplode(j.relacl) b
                      WHERE j.oid = 'pgwake.jobs'::regclass AND b.grantee = a.grantee
                        AND b.privilege_type = 'INSERT')
) found
WHERE kind IS NOT NULL
ON CONFLICT DO NOTHING;
