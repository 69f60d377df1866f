-- pgwake schema, version 15: a max_running limit counts the jobs already
-- running when it is set. Jobs claimed while their queue had no limit hold
-- no slot row: lease-mode ones are in pgwake.leased_jobs with holds_slot
-- false; tx-mode ones are recorded here, one queue name per job of the
-- batch, by the batch's durable mark (src/db/sql/batch_mark.sql). The
-- limited claims (src/db/sql/claim_*_limited.sql, claim_tx_one.sql) count
-- both and use only as many slots as the limit leaves. NULL (a batch that
-- holds slots, or one marked by an older worker): counts nothing.
ALTER TABLE pgwake.tx_batches ADD COLUMN queues text[];
