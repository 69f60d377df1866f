-- This worker is busy (or leaving): producers need not NOTIFY it.
DELETE FROM pgwake.waiting_workers WHERE worker_id = $1
