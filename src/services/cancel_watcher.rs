//! The cancel watcher: the poll fallback of cancel delivery (the
//! notification is the fast path; the request row is what cannot be lost).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::admin::cancel::SWEEP_INTERVAL;
use crate::claim::run::cancels::CancelBook;
use crate::db::connect::PooledConn;
use crate::db::sql::{Db, CANCEL_POLL as POLL, CANCEL_SWEEP as SWEEP};
use crate::error::{Error, Result};

/// The watcher service: the poll fallback of cancel delivery. Every
/// `interval` (and at once after a listener (re)connect) it asks which of
/// the jobs this worker runs have a cancel request, and stops them; every
/// [`SWEEP_INTERVAL`] it removes requests whose job has finished.
pub(crate) struct Watcher {
    pool: deadpool_postgres::Pool,
    book: Arc<CancelBook>,
    config: WatcherConfig,
}

/// How the cancel watcher runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WatcherConfig {
    /// Time between polls of the cancel requests (`--cancel-poll-interval`).
    pub interval: Duration,
}

impl Watcher {
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        book: Arc<CancelBook>,
        config: WatcherConfig,
    ) -> Self {
        Watcher { pool, book, config }
    }

    /// Poll until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut last_sweep = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.book.poll_now.notified() => {}
                _ = tokio::time::sleep(self.config.interval) => {}
            }
            if let Err(e) = self.run_once().await {
                tracing::warn!(error = %e, "cancel poll failed; retrying at the next interval");
            }
            if last_sweep.elapsed() >= SWEEP_INTERVAL {
                last_sweep = Instant::now();
                if let Err(e) = self.sweep().await {
                    tracing::warn!(error = %e, "removing finished jobs' cancel requests failed");
                }
            }
        }
    }

    /// One poll: stop every run of this worker that has a cancel request;
    /// returns how many were stopped.
    pub(crate) async fn run_once(&self) -> Result<usize> {
        let ids = self.book.ids();
        if ids.is_empty() {
            return Ok(0);
        }
        let mut conn = PooledConn::get(&self.pool, "cancel poll: no connection").await?;
        let r = Db::unnamed(&conn).query(&POLL, &[&ids]).await;
        let rows = conn.check(r).map_err(Error::db("cancel poll"))?;
        Ok(rows
            .iter()
            .filter(|r| self.book.cancel(r.get::<_, i64>(0)))
            .count())
    }

    async fn sweep(&self) -> Result<u64> {
        let mut conn = PooledConn::get(&self.pool, "cancel sweep: no connection").await?;
        let r = Db::unnamed(&conn).execute(&SWEEP, &[]).await;
        conn.check(r).map_err(Error::db("cancel sweep"))
    }
}
