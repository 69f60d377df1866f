-- Open a batch (pgwake.batch_open, functions/flows.sql): its callback job
-- of task $1 with payload $2 in queue $3 (NULL: default), held until the
-- batch is closed and every job of it has ended; $4: seconds after which
-- the rescuer closes it if no producer has. Returns the batch's id.
SELECT pgwake.batch_open($1, coalesce($2::text::jsonb, '{}'), coalesce($3, 'default'),
                         close_within => make_interval(secs => $4))
