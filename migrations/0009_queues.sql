-- pgwake schema, version 9: per-queue settings (`pgwake queue …`,
-- pgwake.pause_queue() / pgwake.resume_queue()).
--
-- One row per queue that has a setting; a queue without a row has none (the
-- common case costs the claim one index probe of this small table, see
-- ARCHITECTURE.md → Queues). `paused`: no claim starts a job of this queue
-- until it is resumed; jobs already running finish.
CREATE TABLE pgwake.queues (
    name       text        PRIMARY KEY CHECK (name <> ''),
    paused     boolean     NOT NULL DEFAULT false,
    paused_at  timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
