-- `pgwake queue set Q --limit-key-path FIELD | --no-limit-key-path`: $1 the
-- queue, $2 the payload field a job's NULL limit key is taken from (NULL:
-- none). See functions/queues.sql.
SELECT pgwake.set_queue_limit_key_path($1::text, $2::text)
