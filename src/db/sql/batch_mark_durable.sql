-- Make the batch mark $1 durable (batch_mark.sql committed it
-- asynchronously): a synchronous commit that wrote WAL flushes the WAL up
-- to its commit record, which holds every earlier commit. (A transaction
-- that only takes an id writes no WAL before its commit record and is not
-- flushed; so this rewrites the mark's row.)
UPDATE pgwake.tx_batches SET worker_id = worker_id WHERE token = $1
