//! How much work a queue has for workers now: `pgwake.queue_pressure`
//! (functions/queue_pressure.sql), for autoscalers and for producers that
//! pace themselves, and `pgwake queue pressure`.
//!
//! ```text
//!  producer loop (every 200 ms) ──▶ read(Some("mail"), CAP_DEFAULT) ─┐
//!  KEDA postgresql trigger ──▶ SELECT running + runnable             ├─▶ pgwake.queue_pressure
//!        FROM pgwake.queue_pressure('mail')                          │   index-bounded: milliseconds
//!  pgwake queue pressure [Q] ──▶ read(…) ─────────────────────────────┘   at 1,000,000 waiting jobs
//! ```
//!
//! [`crate::admin::stats`] counts every job of every queue and asks which
//! workers can run them: about 0.5 s at a million waiting jobs, too slow for
//! a loop. This reads one queue's ready jobs up to a cap on its claim index,
//! its jobs in flight and its settings.

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::db::sql::{Db, QUEUE_PRESSURE};
use crate::error::{Error, Result};

/// The cap of the ready count when the caller names none (the SQL
/// function's default).
pub const CAP_DEFAULT: i32 = 10_000;

/// The largest cap the function takes.
pub const CAP_MAX: i32 = 1_000_000;

/// One queue's pressure, as `pgwake.queue_pressure` returns it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[non_exhaustive]
pub struct QueuePressure {
    /// The queue.
    pub queue: String,
    /// Jobs a worker could start now: 0 when the queue is paused, else
    /// `ready` cut to the free slots of its max-running limit and to the
    /// admissions its rate has free now. Per-key limits and rates are not
    /// applied (with them it is an upper bound).
    pub runnable: i64,
    /// Waiting jobs whose `run_at` has come, not held behind an earlier job
    /// of their ordering key and not running in a tx-mode claim, counted up
    /// to the cap (see `capped`).
    pub ready: i64,
    /// Jobs of the queue in flight: leased (running, prefetched, or expired
    /// until rescued) and running in tx-mode claims. Not capped.
    pub running: i64,
    /// Seconds the longest-waiting ready job has waited (since the later of
    /// its `created_at` and `run_at`); 0 when none is ready.
    pub oldest_ready_age_seconds: f64,
    /// Whether the queue is paused.
    pub paused: bool,
    /// Whether `ready` stopped at the cap: there are at least that many.
    pub capped: bool,
}

impl QueuePressure {
    /// What an autoscaler divides by one worker's concurrency: the jobs the
    /// workers run now plus those they could start (`running + runnable`).
    pub fn demand(&self) -> i64 {
        self.running.saturating_add(self.runnable)
    }
}

/// `queue`'s pressure (one row, zeros for a queue with no job and no
/// setting), or every queue's (`None`: queues with waiting, leased jobs or
/// settings, by name). `cap` bounds the ready count: 1 to [`CAP_MAX`].
pub async fn read<C: GenericClient>(
    db: &C,
    queue: Option<&str>,
    cap: i32,
) -> Result<Vec<QueuePressure>> {
    if !(1..=CAP_MAX).contains(&cap) {
        return Err(Error::Config(format!(
            "the cap of the ready count must be 1 to {CAP_MAX}, got {cap}"
        )));
    }
    let rows = Db::unnamed(db.client())
        .query(&QUEUE_PRESSURE, &[&queue, &cap])
        .await
        .map_err(Error::db("cannot read the queue pressure"))?;
    Ok(rows
        .iter()
        .map(|r| QueuePressure {
            queue: r.get(0),
            runnable: r.get(1),
            ready: r.get(2),
            running: r.get(3),
            oldest_ready_age_seconds: r.get(4),
            paused: r.get(5),
            capped: r.get(6),
        })
        .collect())
}

/// Render as a fixed-width table (`pgwake queue pressure`); a capped count
/// is shown as `N+`.
pub fn render_table(rows: &[QueuePressure]) -> String {
    let width = rows
        .iter()
        .map(|r| crate::admin::stats::printable(&r.queue).chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:>10}  {:>10}  {:>10}  {:>16}  STATE\n",
        "QUEUE", "RUNNABLE", "READY", "RUNNING", "OLDEST READY (s)"
    );
    for r in rows {
        let plus = |capped: bool| if capped { "+" } else { "" };
        out.push_str(&format!(
            "{:<width$}  {:>10}  {:>10}  {:>10}  {:>16.3}  {}\n",
            crate::admin::stats::printable(&r.queue),
            format!("{}{}", r.runnable, plus(r.capped && r.runnable == r.ready)),
            format!("{}{}", r.ready, plus(r.capped)),
            r.running,
            r.oldest_ready_age_seconds,
            if r.paused { "paused" } else { "running" }
        ));
    }
    if rows.is_empty() {
        out.push_str("(no queues)\n");
    }
    out
}
