-- pgwake schema, version 14: bounds where a value meets the database.
--
-- * A job's timeout is at most 24 days: the claim transaction's statement
--   and idle limits are the job's timeout in milliseconds, which the server
--   holds in 32 bits (24.8 days); a longer timeout made a tx-mode job fail
--   to start ("crashed") on every attempt.
-- * Ordering and unique keys are at most 1024 bytes: the unique index
--   refuses entries above about 2.7 KB with an error naming the index, not
--   the limit.
-- * Queue names hold no control characters: they are printed by
--   `pgwake stats`, logs and the dashboard.
-- * max_running is at most 100000: each unit is a slot row, written in the
--   transaction that sets the limit.
-- NOT VALID: existing rows are not checked (no scan, a brief lock); every
-- new or updated row is. The worker clamps an older job's longer timeout.
ALTER TABLE pgwake.jobs
    ADD CONSTRAINT jobs_timeout_max CHECK (timeout <= interval '24 days') NOT VALID,
    ADD CONSTRAINT jobs_keys_length
        CHECK (octet_length(unique_key) <= 1024 AND octet_length(ordering_key) <= 1024) NOT VALID,
    ADD CONSTRAINT jobs_queue_printable CHECK (queue !~ '[[:cntrl:]]') NOT VALID;
ALTER TABLE pgwake.queues
    ADD CONSTRAINT queues_name_printable CHECK (name !~ '[[:cntrl:]]') NOT VALID,
    ADD CONSTRAINT queues_max_running_max CHECK (max_running <= 100000) NOT VALID;
