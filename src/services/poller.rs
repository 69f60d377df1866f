//! The fallback poller. It always runs, LISTEN or not:
//!
//! - every `poll_interval` (±25% jitter, so a fleet of workers does not poll
//!   in lockstep) it wakes one claim task, which catches anything a
//!   notification missed;
//! - it sleeps exactly until the earliest future `run_at` it knows of, so a
//!   scheduled job or a retry starts on time without any NOTIFY. Retries this
//!   worker schedules are passed in through [`Schedule::hint`] at once;
//!   scheduled jobs inserted by producers are learnt at the next poll.
//!
//! Clocks: `run_at` is the database's clock; this machine's may be off. The
//! poller never compares the two: the database says how long until the next
//! job is due (`run_at - now()`), and each poll measures the offset between
//! the clocks, with which [`Schedule::hint`] turns a database timestamp (a
//! retry's `run_at`) into a local deadline. A worker whose clock runs ahead
//! therefore sleeps until the job is due by the database's clock instead of
//! polling in a tight loop until then.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::claim::choose::next_due::{secs, Schedule};
use crate::claim::choose::wake::{Trigger, Wakeup};
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// How the poller runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PollerConfig {
    /// Time between polls, jittered ±25% (`--poll-interval`).
    pub interval: Duration,
    /// The queues whose next due job it asks for (`None`: every queue).
    pub queues: Option<Vec<String>>,
}

/// The poller service.
pub(crate) struct Poller {
    pool: deadpool_postgres::Pool,
    config: PollerConfig,
    wake: Arc<Wakeup>,
    schedule: Arc<Schedule>,
}

/// ±25% jitter around `d`.
pub(crate) fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.75 + rand::random::<f64>() * 0.5)
}

impl Poller {
    /// A poller over `queues` (`None`: all).
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        config: PollerConfig,
        wake: Arc<Wakeup>,
        schedule: Arc<Schedule>,
    ) -> Poller {
        Poller {
            pool,
            config,
            wake,
            schedule,
        }
    }

    /// Poll until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        loop {
            let tick = jitter(self.config.interval);
            let until_due = self
                .schedule
                .next_due()
                .map(|at| at.saturating_duration_since(Instant::now()));
            let sleep = until_due.map_or(tick, |d| d.min(tick));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.schedule.changed.notified() => continue,
                _ = tokio::time::sleep(sleep) => {}
            }
            if let Err(e) = self.run_once().await {
                tracing::debug!(error = %e, "poller: cannot read the next run_at");
            }
        }
    }

    /// Wake one claim task, then learn how long until the next scheduled job
    /// is due by the database's clock.
    pub(crate) async fn run_once(&self) -> Result<Option<Duration>> {
        self.wake.wake_one(Trigger::Poll);
        let mut conn = crate::db::connect::PooledConn::get(&self.pool, "poller").await?;
        let r = match &self.config.queues {
            None => {
                Db::unnamed(&conn)
                    .query_one(&sql::NEXT_RUN_AT_ALL, &[])
                    .await
            }
            Some(q) => {
                Db::unnamed(&conn)
                    .query_one(&sql::NEXT_RUN_AT_QUEUES, &[q])
                    .await
            }
        };
        let row = conn.check(r).map_err(Error::db("poller"))?;
        let due_in: Option<f64> = row.get(0);
        let db_now: f64 = row.get(1);
        self.schedule.set_offset(db_now - secs(SystemTime::now()));
        let due_in = due_in.map(|s| Duration::from_secs_f64(s.clamp(0.0, 1e9)));
        self.schedule.set(due_in.map(|d| Instant::now() + d));
        Ok(due_in)
    }
}
