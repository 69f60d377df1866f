-- Lease-mode jobs done: remove their leases, fenced by claim token ($1) so
-- a late worker cannot complete a later run of the same job. Returns the
-- tokens that matched; the others were fenced out.
DELETE FROM pgwake.leased_jobs WHERE token = ANY($1::bigint[]) RETURNING token
