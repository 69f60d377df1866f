//! The fallback poller. It always runs, LISTEN or not:
//!
//! - every `poll_interval` (±25% jitter, so a fleet of workers does not poll
//!   in lockstep) it wakes one claim task, which catches anything a
//!   notification missed;
//! - it sleeps exactly until the earliest future `run_at` it knows of, so a
//!   scheduled job or a retry starts on time without any NOTIFY. Retries this
//!   worker schedules are passed in through [`Schedule::hint`] at once;
//!   scheduled jobs inserted by producers are learnt at the next poll.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::wake::{Trigger, Wakeup};

/// The next moment a scheduled job falls due, as far as this worker knows.
#[derive(Debug, Default)]
pub struct Schedule {
    next: Mutex<Option<SystemTime>>,
    changed: Notify,
}

impl Schedule {
    /// A job becomes due at `at`: wake the poller earlier if needed.
    pub fn hint(&self, at: SystemTime) {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_none_or(|n| at < n) {
            *next = Some(at);
            drop(next);
            self.changed.notify_one();
        }
    }

    fn next_due(&self) -> Option<SystemTime> {
        *self.next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replace what the poller learnt from the database, keeping a hint that
    /// arrived meanwhile and is still in the future.
    fn set(&self, at: Option<SystemTime>) {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let now = SystemTime::now();
        let pending = next.filter(|n| *n > now);
        *next = match (pending, at) {
            (Some(p), Some(a)) => Some(p.min(a)),
            (p, a) => p.or(a),
        };
    }
}

/// The poller service.
pub struct Poller {
    pool: deadpool_postgres::Pool,
    queues: Option<Vec<String>>,
    interval: Duration,
    wake: Arc<Wakeup>,
    schedule: Arc<Schedule>,
}

/// ±25% jitter around `d`.
pub fn jitter(d: Duration) -> Duration {
    d.mul_f64(0.75 + rand::random::<f64>() * 0.5)
}

impl Poller {
    /// A poller over `queues` (`None`: all).
    pub fn new(
        pool: deadpool_postgres::Pool,
        queues: Option<Vec<String>>,
        interval: Duration,
        wake: Arc<Wakeup>,
        schedule: Arc<Schedule>,
    ) -> Poller {
        Poller {
            pool,
            queues,
            interval,
            wake,
            schedule,
        }
    }

    /// Poll until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            let tick = jitter(self.interval);
            let until_due = self.schedule.next_due().map(|at| {
                at.duration_since(SystemTime::now())
                    .unwrap_or(Duration::ZERO)
            });
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

    /// Wake one claim task, then learn when the next scheduled job is due.
    pub async fn run_once(&self) -> Result<Option<SystemTime>> {
        self.wake.wake_one(Trigger::Poll);
        let mut conn = crate::connect::PooledConn::get(&self.pool, "poller").await?;
        let r = match &self.queues {
            None => {
                let stmt = conn
                    .prepare_cached(include_str!("sql/next_run_at_all.sql"))
                    .await
                    .map_err(Error::db("poller"))?;
                conn.query_one(&stmt, &[]).await
            }
            Some(q) => {
                let stmt = conn
                    .prepare_cached(include_str!("sql/next_run_at_queues.sql"))
                    .await
                    .map_err(Error::db("poller"))?;
                conn.query_one(&stmt, &[q]).await
            }
        };
        let row = conn.check(r).map_err(Error::db("poller"))?;
        let next: Option<SystemTime> = row.get(0);
        self.schedule.set(next);
        Ok(next)
    }
}
