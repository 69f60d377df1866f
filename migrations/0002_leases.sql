-- pgwake schema, version 2: lease mode. A lease-mode claim moves the job
-- from pgwake.jobs into this table, with attempts + 1, the worker's id and
-- lease_until, and commits at once: no transaction stays open while the
-- handler runs. A heartbeat extends lease_until; completion deletes the row
-- fenced by (id, attempts); any worker moves expired leases back.
CREATE TABLE pgwake.leased_jobs (
    id           bigint      PRIMARY KEY,
    queue        text        NOT NULL,
    task         text        NOT NULL,
    payload      jsonb       NOT NULL,
    priority     integer     NOT NULL,
    run_at       timestamptz NOT NULL,
    -- includes the running attempt
    attempts     integer     NOT NULL,
    max_attempts integer     NOT NULL,
    last_error   text,
    created_at   timestamptz NOT NULL,
    worker_id    text        NOT NULL,
    leased_at    timestamptz NOT NULL DEFAULT now(),
    lease_until  timestamptz NOT NULL
) WITH (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
CREATE INDEX leased_jobs_lease_until_idx ON pgwake.leased_jobs (lease_until);
