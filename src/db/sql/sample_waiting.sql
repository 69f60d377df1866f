-- Sampler (pgwake_jobs_waiting): per queue, the waiting jobs by what they
-- wait for, as `pgwake stats` counts them (stats_snoozed.sql,
-- stats_waits.sql, stats_parents.sql): `snoozed` (their handler snoozed
-- them), `sleeping` (put to sleep), `signal` (waiting for a signal),
-- `parents` (held until their parents end done). $1: the rows read per kind
-- (gauges.rs, WAITING_CAP).
--
-- Bounded: each kind reads at most $1 rows of its own table, which holds
-- only jobs that ever snoozed or waited, or the edges of flows (never the
-- queue), and looks each job up by id: the LATERAL's LIMIT keeps the
-- lookup a probe of the jobs' primary key (a plain join was planned as a
-- hash join over a sequential scan of pgwake.jobs, whatever its size). A
-- kind with more rows than that counts those it read.
WITH snoozed AS (
    SELECT j.queue
    FROM (SELECT s.job_id, s.snoozed_until FROM pgwake.job_snoozes s LIMIT $1) s
    CROSS JOIN LATERAL (SELECT j.queue FROM pgwake.jobs j
                        WHERE j.id = s.job_id AND j.run_at = s.snoozed_until AND j.run_at > now()
                        LIMIT 1) j
), waits AS (
    SELECT j.queue, CASE WHEN w.kind = 'sleep' THEN 'sleeping' ELSE 'signal' END AS reason
    FROM (SELECT w.job_id, w.kind, w.wait_until FROM pgwake.job_waits w
          WHERE w.kind = 'sleep' OR (w.kind = 'signal' AND w.signal_state = 'waiting')
          LIMIT $1) w
    CROSS JOIN LATERAL (SELECT j.queue FROM pgwake.jobs j
                        WHERE j.id = w.job_id AND j.run_at = w.wait_until AND j.run_at > now()
                        LIMIT 1) j
), parents AS (
    SELECT j.queue
    FROM (SELECT DISTINCT e.child
          FROM (SELECT e.child FROM pgwake.job_parents e WHERE e.state <> 'done' LIMIT $1) e) c
    CROSS JOIN LATERAL (SELECT j.queue FROM pgwake.jobs j
                        WHERE j.id = c.child AND j.parents_open > 0
                        LIMIT 1) j
)
SELECT queue, 'snoozed'::text, count(*)::int8 FROM snoozed GROUP BY queue
UNION ALL
SELECT queue, reason, count(*)::int8 FROM waits GROUP BY queue, reason
UNION ALL
SELECT queue, 'parents'::text, count(*)::int8 FROM parents GROUP BY queue
