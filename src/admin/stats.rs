//! `pgwake stats`: per queue, ready and scheduled depth, lease-mode jobs in
//! flight, snoozed jobs, dead count, the oldest ready job's age, whether the queue is
//! paused and its limits (per queue and per limit key); uncapped counts (this is an on-demand command, not
//! the per-interval sampler). Running tx-mode claims are left out of `ready`
//! among each queue's first `sampler::RUNNING_CHECK_WINDOW` ready jobs.
//!
//! "What ran?": per queue, the jobs done, retried and dead over a recent
//! window ([`Recent`], one hour by default, `--since`), read from the
//! workers' per-minute rollup (`pgwake.minute_stats`,
//! `src/services/rollup.rs`), which counts every run whether full history
//! is on or not.

use serde::Serialize;

use crate::error::Result;

/// One queue's line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueStats {
    /// Queue name.
    pub queue: String,
    /// Jobs ready to run now (running jobs excluded).
    pub ready: i64,
    /// Jobs scheduled for later.
    pub scheduled: i64,
    /// Of `scheduled`, the jobs their handler snoozed
    /// ([`crate::Outcome::Snooze`]): waiting with the run_at their last
    /// snooze gave them.
    pub snoozed: i64,
    /// The most snoozes one of the `snoozed` jobs has had (0 when none);
    /// `pgwake explain` warns past [`crate::SNOOZES_WARN`].
    pub most_snoozes: i32,
    /// Of `scheduled`, the jobs their handler put to sleep
    /// ([`crate::Outcome::Sleep`]).
    pub sleeping: i64,
    /// Of `scheduled`, the jobs waiting for a signal
    /// ([`crate::Outcome::WaitFor`]), due at their timeout.
    pub waiting_for_signal: i64,
    /// Jobs held until their parents end done (docs/src/flows.md); they are
    /// counted in `ready` or `scheduled` too.
    pub waiting_for_parents: i64,
    /// Lease-mode jobs in flight: running, or held by a worker that died
    /// until the rescuer moves them back (`expired_leases` of them have
    /// passed their `lease_until`). Running tx-mode jobs are not counted
    /// here (they are rows a claim transaction holds; the
    /// idle-in-transaction metrics show them).
    pub leased: i64,
    /// Of `leased`, those whose lease has expired: their worker stopped
    /// heartbeating; the next rescue moves them back (or to `dead_jobs`).
    pub expired_leases: i64,
    /// Jobs in `dead_jobs`.
    pub dead: i64,
    /// Age of the oldest ready job, seconds (0 when none is ready).
    pub oldest_ready_age_seconds: f64,
    /// Whether the queue is paused (`pgwake queue pause`): its jobs wait.
    pub paused: bool,
    /// Ready jobs of this queue that no live worker can run, per task (none
    /// works the queue with a handler for the task): they wait until one
    /// starts. Counted among the first 1,000 ready jobs of each priority.
    pub unserved: Vec<crate::admin::workers::Unserved>,
    /// The queue's limits (`pgwake queue set`), as `pgwake queue list`
    /// shows them.
    pub limits: QueueLimits,
    /// What ran over the recent window (the per-minute rollup).
    pub recent: Recent,
}

/// Default window of [`Recent`]: the last hour.
pub const RECENT_WINDOW_DEFAULT: std::time::Duration = std::time::Duration::from_secs(3600);
/// Shortest window accepted (one minute: the rollup's grain).
pub const RECENT_WINDOW_MIN: std::time::Duration = std::time::Duration::from_secs(60);
/// Longest window accepted (the rollup keeps 48 h by default).
pub const RECENT_WINDOW_MAX: std::time::Duration = std::time::Duration::from_secs(7 * 86400);

/// One queue's outcomes over a recent window, from the per-minute rollup.
/// The window starts at the beginning of the minute `window_seconds` ago
/// and runs to now; counts a worker has not flushed yet (up to its
/// `--stats-flush-interval`) are missing.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Recent {
    /// The window, seconds.
    pub window_seconds: f64,
    /// Runs that ended done.
    pub done: i64,
    /// Runs that failed and were scheduled again.
    pub retried: i64,
    /// Runs that moved their job to `dead_jobs` (cancelled ones included).
    pub dead: i64,
    /// Runs per second over the window (done + retried + dead).
    pub jobs_per_second: f64,
    /// Mean pickup latency of these runs, seconds (`None`: no run).
    pub pickup_mean_seconds: Option<f64>,
    /// Longest pickup latency of these runs, seconds.
    pub pickup_max_seconds: Option<f64>,
}

/// Check a `--since` window; the error names the flag and the range.
pub fn check_window(window: std::time::Duration) -> Result<()> {
    if window < RECENT_WINDOW_MIN || window > RECENT_WINDOW_MAX {
        return Err(crate::error::Error::Config(format!(
            "--since must be between 1m and 7d (the per-minute rollup's grain and a bound on the rows read); got {}",
            humantime::format_duration(window)
        )));
    }
    Ok(())
}

/// Per queue, what ran over the last `window` (the per-minute rollup).
pub async fn recent(
    client: &tokio_postgres::Client,
    window: std::time::Duration,
) -> Result<std::collections::BTreeMap<String, Recent>> {
    check_window(window)?;
    let secs = window.as_secs_f64();
    let rows = crate::db::sql::Db::unnamed(client)
        .query(&crate::db::sql::ROLLUP_TOTALS, &[&secs])
        .await
        .map_err(crate::error::Error::db(
            "stats: reading the per-minute rollup",
        ))?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (done, retried, dead): (i64, i64, i64) = (r.get(1), r.get(2), r.get(3));
            (
                r.get(0),
                Recent {
                    window_seconds: secs,
                    done,
                    retried,
                    dead,
                    jobs_per_second: (done + retried + dead) as f64 / secs,
                    pickup_mean_seconds: r.get(4),
                    pickup_max_seconds: r.get(5),
                },
            )
        })
        .collect())
}

/// A queue's limits, per queue and per limit key (`None`/false: not set).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct QueueLimits {
    /// `--max-running`.
    pub max_running: Option<i32>,
    /// `--rate`, in admissions per second.
    pub rate_per_second: Option<f64>,
    /// `--max-running-per-key` (a key's own limit may differ).
    pub max_running_per_key: Option<i32>,
    /// `--rate-per-key`, in admissions of one key per second.
    pub rate_per_key_per_second: Option<f64>,
    /// `--fair-keys`.
    pub fair_keys: bool,
}

impl QueueLimits {
    /// Of `queue`, from a sample.
    fn of(sample: &crate::admin::gauges::Sample, queue: &str) -> QueueLimits {
        fn find<T: Copy>(v: &[(String, T)], queue: &str) -> Option<T> {
            v.iter().find(|(q, _)| q == queue).map(|(_, n)| *n)
        }
        QueueLimits {
            max_running: find(&sample.max_running, queue),
            rate_per_second: find(&sample.rate, queue),
            max_running_per_key: find(&sample.max_running_per_key, queue),
            rate_per_key_per_second: find(&sample.rate_per_key, queue),
            fair_keys: sample.fair_keys.iter().any(|q| q == queue),
        }
    }

    /// One short line: `max 3, 20/s, per key: max 2, 5/s, fair` (`-`: none).
    pub fn summary(&self) -> String {
        let mut queue = Vec::new();
        if let Some(n) = self.max_running {
            queue.push(format!("max {n}"));
        }
        if let Some(r) = self.rate_per_second {
            queue.push(format!("{r}/s"));
        }
        let mut key = Vec::new();
        if let Some(n) = self.max_running_per_key {
            key.push(format!("max {n}"));
        }
        if let Some(r) = self.rate_per_key_per_second {
            key.push(format!("{r}/s"));
        }
        if self.fair_keys {
            key.push("fair".to_string());
        }
        if !key.is_empty() {
            queue.push(format!("per key: {}", key.join(", ")));
        }
        if queue.is_empty() {
            "-".into()
        } else {
            queue.join(", ")
        }
    }
}

/// Read every queue's numbers, with what ran over the last hour.
pub async fn read(pool: &deadpool_postgres::Pool) -> Result<Vec<QueueStats>> {
    read_since(pool, RECENT_WINDOW_DEFAULT).await
}

/// Read every queue's numbers, with what ran over the last `window`
/// (between [`RECENT_WINDOW_MIN`] and [`RECENT_WINDOW_MAX`]).
pub async fn read_since(
    pool: &deadpool_postgres::Pool,
    window: std::time::Duration,
) -> Result<Vec<QueueStats>> {
    check_window(window)?;
    // Every queue, uncapped counts, no time limit: an on-demand command.
    let sample = crate::admin::gauges::sample_with(pool, i64::MAX, None).await?;
    let conn = pool
        .get()
        .await
        .map_err(crate::error::Error::pool("stats: no connection"))?;
    let leased: std::collections::HashMap<String, (i64, i64)> = crate::db::sql::Db::unnamed(&conn)
        .query(&crate::db::sql::STATS_LEASED, &[])
        .await
        .map_err(crate::error::Error::db("stats: reading leases"))?
        .into_iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let snoozed: std::collections::HashMap<String, (i64, i32)> = crate::db::sql::Db::unnamed(&conn)
        .query(&crate::db::sql::STATS_SNOOZED, &[])
        .await
        .map_err(crate::error::Error::db("stats: reading snoozed jobs"))?
        .into_iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let waits: std::collections::HashMap<String, (i64, i64)> = crate::db::sql::Db::unnamed(&conn)
        .query(&crate::db::sql::STATS_WAITS, &[])
        .await
        .map_err(crate::error::Error::db("stats: reading waiting jobs"))?
        .into_iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let parents: std::collections::HashMap<String, i64> = crate::db::sql::Db::unnamed(&conn)
        .query(&crate::db::sql::STATS_PARENTS, &[])
        .await
        .map_err(crate::error::Error::db(
            "stats: reading jobs waiting for parents",
        ))?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let unserved = crate::admin::workers::unserved(
        &conn,
        crate::admin::workers::UNSERVED_HEAD,
        crate::admin::workers::UNSERVED_PAIRS_MAX,
    )
    .await
    .map_err(crate::error::Error::db("stats: reading unserved jobs"))?;
    let recent = recent(&conn, window).await?;
    let recent_of = |queue: &str| -> Recent {
        recent.get(queue).cloned().unwrap_or(Recent {
            window_seconds: window.as_secs_f64(),
            ..Recent::default()
        })
    };
    let unserved_of = |queue: &str| -> Vec<crate::admin::workers::Unserved> {
        unserved
            .iter()
            .filter(|u| u.queue == queue)
            .cloned()
            .collect()
    };
    let mut stats: Vec<QueueStats> = sample
        .queues
        .clone()
        .into_iter()
        .map(|q| QueueStats {
            paused: sample.paused.contains(&q.queue),
            limits: QueueLimits::of(&sample, &q.queue),
            unserved: unserved_of(&q.queue),
            recent: recent_of(&q.queue),
            leased: leased.get(&q.queue).map_or(0, |l| l.0),
            expired_leases: leased.get(&q.queue).map_or(0, |l| l.1),
            snoozed: snoozed.get(&q.queue).map_or(0, |s| s.0),
            most_snoozes: snoozed.get(&q.queue).map_or(0, |s| s.1),
            sleeping: waits.get(&q.queue).map_or(0, |w| w.0),
            waiting_for_signal: waits.get(&q.queue).map_or(0, |w| w.1),
            waiting_for_parents: parents.get(&q.queue).copied().unwrap_or(0),
            queue: q.queue,
            ready: q.ready,
            scheduled: q.scheduled,
            dead: q.dead,
            oldest_ready_age_seconds: q.oldest_ready_age,
        })
        .collect();
    // A paused or limited queue shows even when it holds no job, and a
    // queue whose only jobs are leased shows too.
    let extra = sample
        .paused
        .iter()
        .chain(sample.max_running.iter().map(|(q, _)| q))
        .chain(sample.rate.iter().map(|(q, _)| q))
        .chain(sample.max_running_per_key.iter().map(|(q, _)| q))
        .chain(sample.rate_per_key.iter().map(|(q, _)| q))
        .chain(&sample.fair_keys)
        .chain(leased.keys())
        // A queue that ran jobs in the window and holds none now.
        .chain(recent.keys())
        .cloned()
        .collect::<std::collections::BTreeSet<String>>();
    for q in extra {
        if !stats.iter().any(|s| s.queue == q) {
            let (leased, expired_leases) = leased.get(&q).copied().unwrap_or((0, 0));
            stats.push(QueueStats {
                paused: sample.paused.contains(&q),
                limits: QueueLimits::of(&sample, &q),
                unserved: unserved_of(&q),
                recent: recent_of(&q),
                queue: q,
                ready: 0,
                scheduled: 0,
                snoozed: 0,
                most_snoozes: 0,
                sleeping: 0,
                waiting_for_signal: 0,
                waiting_for_parents: 0,
                leased,
                expired_leases,
                dead: 0,
                oldest_ready_age_seconds: 0.0,
            });
        }
    }
    stats.sort_by(|a, b| a.queue.cmp(&b.queue));
    Ok(stats)
}

/// Render as a fixed-width table.
pub fn render_table(stats: &[QueueStats]) -> String {
    let width = stats
        .iter()
        .map(|s| printable(&s.queue).chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:>10}  {:>10}  {:>10}  {:>14}  {:>10}  {:>10}  {:>10}  {:>16}  {:<7}  {}\n",
        "QUEUE",
        "READY",
        "SCHEDULED",
        "SNOOZED",
        "SLEEP/SIGNAL",
        "PARENTS",
        "LEASED",
        "DEAD",
        "OLDEST READY (s)",
        "STATE",
        "LIMITS"
    );
    for s in stats {
        let leased = match s.expired_leases {
            0 => s.leased.to_string(),
            n => format!("{} ({n} exp.)", s.leased),
        };
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:>10}  {:>10}  {:>14}  {:>10}  {:>10}  {:>10}  {:>16.3}  {:<7}  {}\n",
            printable(&s.queue),
            s.ready,
            s.scheduled,
            match s.most_snoozes {
                0 => s.snoozed.to_string(),
                n => format!("{} (max {n})", s.snoozed),
            },
            format!("{}/{}", s.sleeping, s.waiting_for_signal),
            s.waiting_for_parents,
            leased,
            s.dead,
            s.oldest_ready_age_seconds,
            if s.paused { "paused" } else { "running" },
            s.limits.summary()
        ));
    }
    if stats.is_empty() {
        out.push_str("(no jobs)\n");
    }
    if let Some(window) = stats.first().map(|s| s.recent.window_seconds) {
        out.push_str(&format!(
            "\nRan in the last {} (per-minute rollup; up to a flush interval behind)\n",
            humantime::format_duration(std::time::Duration::from_secs(window as u64))
        ));
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:>10}  {:>10}  {:>10}  {:>16}\n",
            "QUEUE", "DONE", "RETRIED", "DEAD", "JOBS/S", "PICKUP MEAN (s)"
        ));
        for s in stats {
            let r = &s.recent;
            out.push_str(&format!(
                "{:<width$}  {:>10}  {:>10}  {:>10}  {:>10.2}  {:>16}\n",
                printable(&s.queue),
                r.done,
                r.retried,
                r.dead,
                r.jobs_per_second,
                r.pickup_mean_seconds
                    .map_or("-".to_string(), |m| format!("{m:.3}"))
            ));
        }
    }
    let unserved: Vec<_> = stats.iter().flat_map(|s| &s.unserved).collect();
    if !unserved.is_empty() {
        out.push_str("\nWaiting for a worker: no live worker works these queues with a handler for these tasks\n");
        for u in unserved {
            out.push_str(&format!(
                "  queue {}  task {}  {} job(s), oldest ready {:.0} s\n",
                printable(&u.queue),
                printable(&u.task),
                u.jobs,
                u.oldest_age_seconds
            ));
        }
    }
    out
}

/// `name` as it may reach a terminal: control characters and the
/// bidirectional-text controls that reorder what a terminal shows (Trojan
/// Source) escaped (`\u{1b}`, `\u{202e}`), everything else as is. Names
/// are chosen by producers.
pub fn printable(name: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() || is_bidi_control(c);
    if !name.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(name);
    }
    std::borrow::Cow::Owned(
        name.chars()
            .map(|c| {
                if escaped(c) {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// The characters that reorder text on display: the bidirectional marks,
/// embeddings, overrides and isolates (Trojan Source). Escaped wherever a
/// producer's text reaches a terminal, a log or a page.
pub fn is_bidi_control(c: char) -> bool {
    matches!(
        c,
        '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
    )
}
