-- pgwake schema, version 18: a schedule can be disabled without removing it
-- (`pgwake schedule disable NAME`, the console): a disabled schedule is not
-- served (no tick is enqueued, none is counted as missed or overdue);
-- enabling it again starts from its first tick after that moment (the ticks
-- of the disabled time are not caught up). Adding a column with a constant
-- default rewrites nothing.
ALTER TABLE pgwake.schedules ADD COLUMN enabled boolean NOT NULL DEFAULT true;
