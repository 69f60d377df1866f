//! The scheduler: every worker runs one; together they enqueue each tick of
//! every schedule exactly once. The database decides, not a leader in
//! memory (River's issue #791: weekly jobs never ran because the in-memory
//! leader restarted too often). One round, in one transaction:
//!
//! ```text
//! SELECT … FROM pgwake.schedules WHERE next_tick <= now()
//!     ORDER BY next_tick LIMIT batch FOR UPDATE SKIP LOCKED
//!   per row, in Rust:   due ticks = cron(next_tick … now())   (catch-up policy)
//!   for the batch:      previous jobs still waiting?          → skip, count
//!                       INSERT the ticks' jobs                (run_at = tick)
//!                       UPDATE next_tick = first tick after now(), counters
//! COMMIT
//! ```
//!
//! (See `round.rs`, which also falls back to one savepoint per schedule
//! when a batch statement fails.)
//!
//! A row is served by whoever locks it; the others skip it. The jobs and the
//! advanced `next_tick` commit together, so after the commit no scheduler
//! finds that tick due again, and before it (a crash, `kill -9`, a lost
//! connection) nothing of it is visible and the row is due again at once.
//! Between rounds the scheduler sleeps until the earliest `next_tick`
//! (an index lookup, measured on the database's clock), at most
//! `max_sleep`, so schedules added or changed meanwhile are seen within
//! `max_sleep`; it opens a transaction only when something is due.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::SchedulerConfig;
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::metrics;

mod round;

/// Delay (jittered ±25%) of a scheduler's first look after start-up.
pub(crate) const STARTUP_DELAY: Duration = Duration::from_millis(500);
/// Sleep when due schedules are all locked by other schedulers (serving
/// them right now, or a dead worker's session the server has not ended yet).
pub(crate) const LOCKED_PAUSE: Duration = Duration::from_millis(100);
/// Schedules that get their own `schedule` label value in
/// `pgwake_schedule_ticks_total` (the first ones this process serves); the
/// others share `_other`, so 10,000 schedules cannot blow up the series count.
pub(crate) const SCHEDULE_LABELS_MAX: usize = 50;
/// The label value shared by schedules past [`SCHEDULE_LABELS_MAX`].
pub(crate) const OTHER_LABEL: &str = "_other";

/// What one round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoundReport {
    /// Due schedules this round locked and looked at.
    pub claimed: usize,
    /// Jobs enqueued (one per tick).
    pub enqueued: u64,
    /// Ticks dropped by catch-up policies.
    pub missed: u64,
    /// Ticks skipped because the schedule's previous job was still waiting.
    pub waiting: u64,
    /// Schedules found invalid (marked, no longer served).
    pub invalid: usize,
    /// Schedules whose statements failed (left due; retried next round).
    pub failed: usize,
}

/// The scheduler service.
pub struct Scheduler {
    pool: deadpool_postgres::Pool,
    config: SchedulerConfig,
}

impl Scheduler {
    /// A scheduler on `pool`.
    pub fn new(pool: deadpool_postgres::Pool, config: SchedulerConfig) -> Scheduler {
        Scheduler { pool, config }
    }

    /// Serve schedules until `shutdown`. A round is never interrupted
    /// half-way: shutdown is checked between rounds (a round is a few
    /// short statements). No transaction is opened while nothing is due.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut counted = None;
        // A first look a moment after start-up, not in the same instant as
        // every other service's (many workers restarting together do not
        // query in lockstep either).
        let mut sleep = crate::services::poller::jitter(STARTUP_DELAY);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(sleep) => {}
            }
            sleep = match self.observe(&mut counted).await {
                Ok(d) if d.is_zero() => match self.drain().await {
                    // Served: look again at once.
                    Ok(r) if r.failed == 0 && r.claimed > 0 => Duration::ZERO,
                    // Due, but another scheduler holds those rows (it is
                    // serving them, or its worker died and the server has
                    // not yet ended its session).
                    Ok(r) if r.failed == 0 => LOCKED_PAUSE,
                    Ok(_) => self.config.error_pause,
                    Err(e) => {
                        ::metrics::counter!(metrics::SCHEDULER_ERRORS).increment(1);
                        tracing::warn!(error = %e, "scheduler: round failed");
                        self.config.error_pause
                    }
                },
                Ok(d) => d,
                Err(e) => {
                    ::metrics::counter!(metrics::SCHEDULER_ERRORS).increment(1);
                    tracing::debug!(error = %e, "scheduler: next tick lookup failed");
                    self.config.error_pause
                }
            };
        }
    }

    /// Rounds until a round finds less than a full batch due.
    async fn drain(&self) -> Result<RoundReport> {
        let mut total = RoundReport::default();
        loop {
            let r = self.run_once().await?;
            total.claimed += r.claimed;
            total.enqueued += r.enqueued;
            total.missed += r.missed;
            total.waiting += r.waiting;
            total.invalid += r.invalid;
            total.failed += r.failed;
            if r.failed > 0 || (r.claimed as i64) < self.config.batch {
                return Ok(total);
            }
        }
    }

    /// One round: claim up to a batch of due schedules and serve them, in
    /// one transaction (each schedule in its own savepoint, so one failing
    /// schedule does not hold back the others).
    pub async fn run_once(&self) -> Result<RoundReport> {
        let mut conn = self.pool.get().await.map_err(Error::pool("scheduler"))?;
        let (report, served) = match round::serve(&mut conn, self.config.batch).await {
            Ok(r) => r,
            Err(e) => {
                if e.is_connection_lost() {
                    // Never back into the pool: the next round gets a fresh one.
                    drop(deadpool_postgres::Object::take(conn));
                }
                return Err(e);
            }
        };
        // Counted once committed.
        for s in served {
            s.record();
        }
        Ok(report)
    }

    /// Update the gauges and return how long to sleep: until the earliest
    /// tick not yet served (an index lookup), at most `max_sleep`; zero when
    /// a tick is due now. The
    /// schedule counts (a pass over the table) are refreshed at most every
    /// `max_sleep`.
    async fn observe(&self, counted: &mut Option<Instant>) -> Result<Duration> {
        let conn = self.pool.get().await.map_err(Error::pool("scheduler"))?;
        let db = Db::unnamed(&conn);
        let until_next: Option<f64> = db
            .query_one(&sql::SCHEDULE_NEXT, &[])
            .await
            .map_err(Error::db("scheduler: next tick"))?
            .get(0);
        ::metrics::gauge!(metrics::SCHEDULE_OVERDUE).set(until_next.map_or(0.0, |s| (-s).max(0.0)));
        if counted.is_none_or(|at| at.elapsed() >= self.config.max_sleep) {
            let row = db
                .query_one(&sql::SCHEDULE_COUNTS, &[])
                .await
                .map_err(Error::db("scheduler: counts"))?;
            ::metrics::gauge!(metrics::SCHEDULES, "state" => "active")
                .set(row.get::<_, i64>(0) as f64);
            ::metrics::gauge!(metrics::SCHEDULES, "state" => "invalid")
                .set(row.get::<_, i64>(1) as f64);
            *counted = Some(Instant::now());
        }
        let max = self.config.max_sleep.as_secs_f64();
        let secs = match until_next {
            None => max,
            Some(s) if s <= 0.0 => 0.0,
            // 1 ms past the tick: waking a hair early would find nothing due.
            Some(s) => (s + 0.001).min(max),
        };
        Ok(Duration::from_secs_f64(secs))
    }
}

/// What serving one schedule did, for the metrics once it is committed.
#[derive(Debug, Default)]
struct Served {
    name: String,
    enqueued: u64,
    missed: u64,
    waiting: u64,
    invalid: bool,
    /// Seconds from each enqueued tick to its enqueue (database clock).
    delays: Vec<f64>,
}

impl Served {
    fn record(self) {
        let label = schedule_label(&self.name);
        for (result, n) in [
            ("enqueued", self.enqueued),
            ("missed", self.missed),
            ("waiting", self.waiting),
        ] {
            if n > 0 {
                ::metrics::counter!(metrics::SCHEDULE_TICKS, "schedule" => label.clone(), "result" => result)
                    .increment(n);
            }
        }
        for d in self.delays {
            ::metrics::histogram!(metrics::SCHEDULE_TICK_DELAY).record(d);
        }
    }
}

/// The `schedule` label of `name`: itself for the first
/// [`SCHEDULE_LABELS_MAX`] schedules this process serves, `_other` after.
fn schedule_label(name: &str) -> String {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let mut seen = SEEN
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if seen.contains(name) {
        return name.to_string();
    }
    if seen.len() < SCHEDULE_LABELS_MAX {
        seen.insert(name.to_string());
        return name.to_string();
    }
    OTHER_LABEL.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_labels_are_bounded_and_stable() {
        let names: Vec<String> = (0..SCHEDULE_LABELS_MAX + 20)
            .map(|i| format!("label-test-{i}"))
            .collect();
        let labels: Vec<String> = names.iter().map(|n| schedule_label(n)).collect();
        let distinct: HashSet<&String> = labels.iter().collect();
        assert!(distinct.len() <= SCHEDULE_LABELS_MAX + 1);
        assert_eq!(labels.last().unwrap(), OTHER_LABEL);
        assert_eq!(
            schedule_label(&names[0]),
            labels[0],
            "a name keeps its label"
        );
    }
}
