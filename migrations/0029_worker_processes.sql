-- pgwake schema, version 29: each worker's persistent handler processes in
-- the registry (issue 34, item 8). One object per pool of processes (a
-- command, with the tasks routed to it):
--
--   {"command": "python3 app.py", "tasks": ["resize", "thumb"],
--    "live": 3, "processes": 4, "in_flight": 5, "capacity": 8,
--    "restarts": 2, "waiting": 0}
--
-- live of processes (--processes) are running and past their hello;
-- in_flight of capacity (the sum of their hellos' inflight) jobs are on
-- them; restarts so far; waiting: jobs the worker started whose handler
-- waits for a process with room. Written with every renewal (10 s); read by
-- the console's Workers page and `pgwake explain`. Workers that do not
-- write it (no persistent handler, or a version before this one) leave
-- '[]'. Bounded: an array of at most 64 pools in 64 kB of text (a worker
-- writes far less: at most 32 pools and 16 tasks each).
--
-- Cost of this migration: a column with a constant default (no rewrite)
-- and its CHECK, verified over the registry's few rows under a brief lock.
-- IF NOT EXISTS: applying it again changes nothing (a test that winds the
-- recorded version back to 25 replays it).
ALTER TABLE pgwake.workers
    ADD COLUMN IF NOT EXISTS processes jsonb NOT NULL DEFAULT '[]'
        CONSTRAINT workers_processes_bounded
        CHECK (jsonb_typeof(processes) = 'array' AND jsonb_array_length(processes) <= 64
               AND octet_length(processes::text) <= 65536);
