-- Advance served schedules to their next tick and add to their counters; in
-- the claim's transaction, so the jobs and the advance commit together.
UPDATE pgwake.schedules s
SET next_tick = u.next_tick, fresh = false,
    last_tick = coalesce(u.last_tick, s.last_tick),
    last_job_id = coalesce(u.last_job_id, s.last_job_id),
    ticks_enqueued = s.ticks_enqueued + u.enqueued,
    ticks_missed = s.ticks_missed + u.missed,
    ticks_waiting = s.ticks_waiting + u.waiting
FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::bigint[],
            $5::bigint[], $6::bigint[], $7::bigint[])
    AS u(name, next_tick, last_tick, last_job_id, enqueued, missed, waiting)
WHERE s.name = u.name
