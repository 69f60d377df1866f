//! The per-minute rollup ("what ran?" without full history): the claim
//! path counts each run's outcome in memory ([`Tally::count`], one short
//! mutex hold per finished run, no statement), and this service adds the
//! counts into `pgwake.minute_stats` with one upsert every
//! `flush_interval` (5 s by default), then prunes minutes older than
//! `retention` every [`PRUNE_EVERY`].
//!
//! ```text
//!   report() ──count──▶ claim::outcome::tally::Tally (queue, task, outcome, minute → jobs, pickup sum/max)
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

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::claim::outcome::tally::{Counts, Key, Tally};
use crate::config::RollupConfig;
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Time between two prunes of old minutes (the first at start-up).
pub(crate) const PRUNE_EVERY: Duration = Duration::from_secs(300);

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
