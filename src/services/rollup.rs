//! The per-minute rollup ("what ran?" without full history): the claim
//! path counts each run's outcome in memory ([`Tally::count`], one short
//! mutex hold per finished run, no statement), and this service adds the
//! counts into `pgwake.minute_stats` with one upsert every
//! `flush_interval` (5 s by default), then prunes minutes older than
//! `retention` every [`PRUNE_EVERY`].
//!
//! ```text
//!   report() ──count──▶ Tally (queue, task, outcome, minute → jobs, pickup sum/max)
//!                          │ every flush_interval: take all
//!                          ▼
//!                 one INSERT … ON CONFLICT DO UPDATE (rows sorted by key)
//!                          │ fails → the counts go back into the tally
//!                          ▼
//!                 pgwake.minute_stats ◀── several workers add into the same rows
//! ```
//!
//! A worker killed with SIGKILL loses its unflushed counts: at most the
//! last `flush_interval` of its outcomes (the jobs themselves are not
//! affected). A clean shutdown flushes once more after the last job ended.
//! Minutes are the worker's clock; workers whose clocks differ by seconds
//! count a boundary's jobs into neighbouring minutes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Default time between two flushes of a worker's counts.
pub const ROLLUP_FLUSH_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// Default time a minute's counts are kept (48 h).
pub const ROLLUP_RETENTION_DEFAULT: Duration = Duration::from_secs(48 * 3600);
/// Shortest retention accepted: the console's charts and `pgwake stats`
/// read the last hour.
pub const ROLLUP_RETENTION_MIN: Duration = Duration::from_secs(3600);
/// Time between two prunes of old minutes (the first at start-up).
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(300);
/// Most distinct rows a tally holds. Counts that would add a row beyond it
/// while the database is unreachable are dropped (and logged): memory stays
/// bounded whatever the outage.
pub(crate) const ROWS_MAX: usize = 100_000;

/// How the rollup runs (the worker's `--stats-*` flags; `crate::services::rollup`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupConfig {
    /// Time between two flushes; a SIGKILL loses at most this much of the
    /// worker's counts. Default [`ROLLUP_FLUSH_INTERVAL_DEFAULT`].
    pub flush_interval: Duration,
    /// Minutes older than this are deleted. Default [`ROLLUP_RETENTION_DEFAULT`];
    /// at least [`ROLLUP_RETENTION_MIN`]. Workers with different settings: the
    /// shortest wins.
    pub retention: Duration,
}

impl Default for RollupConfig {
    fn default() -> Self {
        RollupConfig {
            flush_interval: ROLLUP_FLUSH_INTERVAL_DEFAULT,
            retention: ROLLUP_RETENTION_DEFAULT,
        }
    }
}

impl RollupConfig {
    /// Check the settings; the error names the flag and the fix.
    pub fn validate(&self) -> Result<()> {
        if self.flush_interval.is_zero() || self.flush_interval > Duration::from_secs(3600) {
            return Err(Error::Config(format!(
                "--stats-flush-interval must be between 1ms and 1h (a SIGKILL loses up to this much of the worker's counts); got {:?}",
                self.flush_interval
            )));
        }
        if self.retention < ROLLUP_RETENTION_MIN
            || self.retention > Duration::from_secs(366 * 86400)
        {
            return Err(Error::Config(format!(
                "--stats-retention must be between 1 h and 366 days (`pgwake stats` and the console read the last hour); got {:?}",
                self.retention
            )));
        }
        Ok(())
    }
}

/// One row's key: epoch minute, queue, task, outcome.
type Key = (i64, String, String, &'static str);

/// One row's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Counts {
    pub jobs: i64,
    pub pickup_sum: f64,
    pub pickup_max: f64,
}

impl Counts {
    fn add(&mut self, other: Counts) {
        self.jobs += other.jobs;
        self.pickup_sum += other.pickup_sum;
        self.pickup_max = self.pickup_max.max(other.pickup_max);
    }
}

/// A worker's counts since the last flush. Shared by the claim path (which
/// counts) and the rollup service (which takes them).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    rows: Mutex<HashMap<Key, Counts>>,
}

impl Tally {
    /// Count one run of `queue`/`task` that ended with `outcome`, `pickup`
    /// seconds after it became ready.
    pub(crate) fn count(&self, queue: &str, task: &str, outcome: &'static str, pickup: f64) {
        let minute = epoch_minute(SystemTime::now());
        self.add(
            (minute, queue.to_owned(), task.to_owned(), outcome),
            Counts {
                jobs: 1,
                pickup_sum: pickup,
                pickup_max: pickup,
            },
        );
    }

    fn add(&self, key: Key, counts: Counts) {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let full = rows.len() >= ROWS_MAX;
        match rows.get_mut(&key) {
            Some(c) => c.add(counts),
            None if full => {
                tracing::warn!(
                    queue = %key.1,
                    "rollup: {ROWS_MAX} rows of counts not flushed yet; dropping a count (is the database reachable?)"
                );
            }
            None => {
                rows.insert(key, counts);
            }
        }
    }

    /// Everything counted so far, sorted by key; the tally is left empty.
    fn take(&self) -> Vec<(Key, Counts)> {
        let taken = std::mem::take(&mut *self.rows.lock().unwrap_or_else(|p| p.into_inner()));
        let mut rows: Vec<_> = taken.into_iter().collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// Put back counts a flush could not write.
    fn restore(&self, rows: Vec<(Key, Counts)>) {
        for (k, c) in rows {
            self.add(k, c);
        }
    }
}

fn epoch_minute(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64 / 60)
}

/// What one flush did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FlushReport {
    /// Rows upserted.
    pub(crate) rows: usize,
    /// Runs they counted.
    pub jobs: i64,
}

/// The rollup service of one worker.
pub(crate) struct Rollup {
    pool: deadpool_postgres::Pool,
    config: RollupConfig,
    tally: Arc<Tally>,
}

impl Rollup {
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        config: RollupConfig,
        tally: Arc<Tally>,
    ) -> Rollup {
        Rollup {
            pool,
            config,
            tally,
        }
    }

    /// Flush every `flush_interval` and prune every [`PRUNE_EVERY`] until
    /// `shutdown`; then flush once more (the worker stops this service
    /// after the last job's outcome is reported).
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(self.config.flush_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_prune = tokio::time::Instant::now();
        loop {
            let stopping = tokio::select! {
                _ = shutdown.cancelled() => true,
                _ = tick.tick() => false,
            };
            if let Err(e) = self.flush().await {
                tracing::warn!(error = %e, "rollup: flushing the per-minute counts failed; they are kept for the next flush");
            }
            if stopping {
                return;
            }
            if tokio::time::Instant::now() >= next_prune {
                next_prune = tokio::time::Instant::now() + PRUNE_EVERY;
                if let Err(e) = self.prune().await {
                    tracing::warn!(error = %e, "rollup: pruning old minutes failed");
                }
            }
        }
    }

    /// Add everything counted so far into `pgwake.minute_stats` (one
    /// statement); on failure the counts go back into the tally.
    pub(crate) async fn flush(&self) -> Result<FlushReport> {
        let rows = self.tally.take();
        if rows.is_empty() {
            return Ok(FlushReport::default());
        }
        match write(&self.pool, &rows).await {
            Ok(()) => Ok(FlushReport {
                rows: rows.len(),
                jobs: rows.iter().map(|(_, c)| c.jobs).sum(),
            }),
            Err(e) => {
                self.tally.restore(rows);
                Err(e)
            }
        }
    }

    /// Delete minutes older than the retention; the rows deleted (stats,
    /// depth).
    pub(crate) async fn prune(&self) -> Result<(i64, i64)> {
        let conn = self
            .pool
            .get()
            .await
            .map_err(Error::pool("rollup: no connection"))?;
        let row = Db::unnamed(&conn)
            .query_one(&sql::ROLLUP_PRUNE, &[&self.config.retention.as_secs_f64()])
            .await
            .map_err(Error::db("rollup: pruning"))?;
        Ok((row.get(0), row.get(1)))
    }
}

async fn write(pool: &deadpool_postgres::Pool, rows: &[(Key, Counts)]) -> Result<()> {
    let minutes: Vec<i64> = rows.iter().map(|(k, _)| k.0).collect();
    let queues: Vec<&str> = rows.iter().map(|(k, _)| k.1.as_str()).collect();
    let tasks: Vec<&str> = rows.iter().map(|(k, _)| k.2.as_str()).collect();
    let outcomes: Vec<&str> = rows.iter().map(|(k, _)| k.3).collect();
    let jobs: Vec<i64> = rows.iter().map(|(_, c)| c.jobs).collect();
    let sums: Vec<f64> = rows.iter().map(|(_, c)| c.pickup_sum).collect();
    let maxes: Vec<f64> = rows.iter().map(|(_, c)| c.pickup_max).collect();
    let conn = pool
        .get()
        .await
        .map_err(Error::pool("rollup: no connection"))?;
    Db::unnamed(&conn)
        .execute(
            &sql::ROLLUP_FLUSH,
            &[&minutes, &queues, &tasks, &outcomes, &jobs, &sums, &maxes],
        )
        .await
        .map_err(Error::db("rollup: flushing"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_adds_runs_of_one_key_into_one_row() {
        let t = Tally::default();
        t.count("q", "a", "done", 0.5);
        t.count("q", "a", "done", 1.5);
        t.count("q", "a", "retry", 0.25);
        let rows = t.take();
        assert_eq!(rows.len(), 2);
        let done = rows.iter().find(|(k, _)| k.3 == "done").unwrap().1;
        assert_eq!(done.jobs, 2);
        assert_eq!(done.pickup_sum, 2.0);
        assert_eq!(done.pickup_max, 1.5);
        assert!(t.take().is_empty(), "take leaves the tally empty");
        t.restore(rows);
        assert_eq!(t.take().len(), 2, "restored counts are flushed again");
    }

    #[test]
    fn bad_settings_name_the_flag() {
        let c = RollupConfig {
            retention: Duration::from_secs(60),
            ..RollupConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--stats-retention"));
        let c = RollupConfig {
            flush_interval: Duration::ZERO,
            ..RollupConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--stats-flush-interval"));
    }
}
