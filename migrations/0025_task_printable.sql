-- pgwake schema, version 25: task names hold no control characters, as
-- queue names already do not (migration 0014): a producer cannot forge log
-- lines or send escape codes to an operator's terminal through a task name
-- (issue 33, item 11; the text log escapes them anyway, for rows stored
-- before this migration).
--
-- Cost of this migration: a CHECK added NOT VALID, so no table scan; the
-- ALTER takes pgwake.jobs' lock briefly (lock_timeout and retry,
-- src/admin/schema.rs). Rows already stored are not checked.
ALTER TABLE pgwake.jobs
    ADD CONSTRAINT jobs_task_printable CHECK (task !~ '[[:cntrl:]]') NOT VALID;
