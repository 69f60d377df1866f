-- The crash check reads a batch's marks by job (src/db/sql/batch_mark.sql):
-- which of the jobs just claimed are named in a mark whose claim
-- transaction is over, or charged in tx_attempts. It used to read every
-- mark (a sequential scan of tx_batches, right after each claim): a few
-- pages while vacuum keeps up, but while a long transaction elsewhere holds
-- the vacuum horizon every batch leaves its deleted mark behind, and the
-- scan grew with them (0.7 ms per claim, a fifth of the worker's database
-- time, after three pinned minutes at 1,500 jobs/s). Looked up by job, it
-- reads only the marks that name the claimed jobs, however many dead ones
-- the table holds.
-- fastupdate off: a pending list would be read whole by every lookup.
-- IF NOT EXISTS: a schema whose migration records were lost (the upgrade
-- tests in tests/services/roles.rs replay them) gets it once.
CREATE INDEX IF NOT EXISTS tx_batches_job_ids ON pgwake.tx_batches USING gin (job_ids)
    WITH (fastupdate = off);
