-- Inside the claim transaction, with its outcomes: the batch reported.
DELETE FROM pgwake.tx_batches WHERE token = $1
