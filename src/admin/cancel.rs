//! Cancellation: the admin API ([`cancel`]) and the worker's side of it.
//!
//! ```text
//!  pgwake.cancel(id)  (functions/cancel.sql, one transaction)
//!    waiting (row free)      ──▶ dead_jobs 'cancelled'                      → Cancelled
//!    leased (lease mode)     ──▶ dead_jobs 'cancelled' (token gone: fenced)  ┐
//!    locked by a claim (tx)  ──▶ (stays with its claim)                      ├ → Requested
//!         both: INSERT cancel_requests + NOTIFY pgwake_control 'cancel <id>' ┘
//!    in dead_jobs                                                            → Dead
//!    nowhere, id issued by the jobs' identity sequence                       → Finished
//!    nowhere, never issued                                                   → NotFound
//!
//!  worker: listener ── notification ──▶ CancelBook::cancel(id) ─┐
//!          Watcher  ── every cancel_poll_interval, and after    ├─▶ the run's token fires:
//!                      each listener (re)connect: requests for  │   handler stopped (exec: process
//!                      the ids this worker runs ────────────────┘   group killed), Resolution::Cancelled
//!          tx: savepoint rolled back (statement cancelled), job buried 'cancelled' in the claim's commit
//!          lease: bury fenced by token (a no-op when pgwake.cancel already did it)
//! ```
//!
//! The notification is the fast path; the request row is what cannot be
//! lost: a worker whose listener was away when the NOTIFY went out finds the
//! row on its next poll (River's issue #1358 was a cancel lost exactly so).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

use crate::db::connect::PooledConn;
use crate::error::{Error, Result};

use crate::db::sql::{Db, CANCEL, CANCEL_POLL as POLL, CANCEL_SWEEP as SWEEP};

/// The NOTIFY channel of cancel requests (payload `cancel <id>`).
pub const CONTROL_CHANNEL: &str = "pgwake_control";

/// How often a worker's watcher removes cancel requests whose job has
/// finished (they can no longer stop anything).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// What [`cancel`] did with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// It was waiting: it left the queue and is in `pgwake.dead_jobs` with
    /// `last_error = 'cancelled'`.
    Cancelled,
    /// It is running: the worker running it stops it and records it as
    /// cancelled (a lease-mode job is recorded at once).
    Requested,
    /// It is already in `pgwake.dead_jobs`; nothing changed.
    Dead,
    /// It existed and has finished (or was purged from `dead_jobs`):
    /// nothing changed.
    Finished,
    /// No job ever had this id; nothing changed.
    NotFound,
}

impl CancelOutcome {
    /// The value `pgwake.cancel()` returns for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::Requested => "cancel_requested",
            CancelOutcome::Dead => "dead",
            CancelOutcome::Finished => "finished",
            CancelOutcome::NotFound => "not_found",
        }
    }

    /// Whether the job is (or will be) cancelled by this call.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, CancelOutcome::Cancelled | CancelOutcome::Requested)
    }

    fn parse(s: &str) -> Result<CancelOutcome> {
        Ok(match s {
            "cancelled" => CancelOutcome::Cancelled,
            "cancel_requested" => CancelOutcome::Requested,
            "dead" => CancelOutcome::Dead,
            "finished" => CancelOutcome::Finished,
            "not_found" => CancelOutcome::NotFound,
            _ => return Err(Error::Unexpected(
                "pgwake.cancel() returned an unknown value (is the schema newer than this pgwake?)",
            )),
        })
    }
}

/// Cancel job `id` (`SELECT pgwake.cancel(id)`): a waiting job leaves the
/// queue at once, a running one is stopped by the worker that runs it. Both
/// end in `pgwake.dead_jobs` with `last_error = 'cancelled'`, from where
/// [`crate::admin::dead::retry`] brings them back. Run inside the caller's
/// transaction if `db` is one.
pub async fn cancel<C: GenericClient>(db: &C, id: i64) -> Result<CancelOutcome> {
    let row = Db::unnamed(db.client())
        .query_one(&CANCEL, &[&id])
        .await
        .map_err(Error::db("cannot cancel the job"))?;
    CancelOutcome::parse(row.get::<_, &str>(0))
}

/// The runs this worker can stop on a cancel, by job id.
#[derive(Debug, Default)]
pub(crate) struct CancelBook {
    running: Mutex<HashMap<i64, Entry>>,
    /// Ask the watcher to poll now (the listener (re)connected: whatever was
    /// notified while it was away is lost).
    poll_now: Notify,
}

#[derive(Debug)]
struct Entry {
    stop: CancellationToken,
    cancelled: Arc<AtomicBool>,
}

/// A run registered in the [`CancelBook`]; unregistered when dropped.
pub(crate) struct Watch {
    book: Arc<CancelBook>,
    id: i64,
    token: CancellationToken,
    cancelled: Arc<AtomicBool>,
}

impl Watch {
    /// Fires when the run must stop: a cancel, or `parent`.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether a cancel request for this job reached the worker.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut running = self.book.running.lock().expect("cancel book");
        if running
            .get(&self.id)
            .is_some_and(|e| Arc::ptr_eq(&e.cancelled, &self.cancelled))
        {
            running.remove(&self.id);
        }
    }
}

impl CancelBook {
    /// Register a run of job `id`; its token is a child of `parent`.
    pub(crate) fn watch(self: &Arc<Self>, id: i64, parent: &CancellationToken) -> Watch {
        let token = parent.child_token();
        let cancelled = Arc::new(AtomicBool::new(false));
        self.running.lock().expect("cancel book").insert(
            id,
            Entry {
                stop: token.clone(),
                cancelled: cancelled.clone(),
            },
        );
        Watch {
            book: self.clone(),
            id,
            token,
            cancelled,
        }
    }

    /// Stop the run of job `id` if this worker has one; returns whether it
    /// had.
    pub(crate) fn cancel(&self, id: i64) -> bool {
        let running = self.running.lock().expect("cancel book");
        let Some(e) = running.get(&id) else {
            return false;
        };
        if !e.cancelled.swap(true, Ordering::AcqRel) {
            tracing::info!(job = id, "cancel request received: stopping the job");
        }
        e.stop.cancel();
        true
    }

    /// A control notification's payload (`cancel <id>`).
    pub(crate) fn on_notification(&self, payload: &str) {
        match payload
            .strip_prefix("cancel ")
            .and_then(|id| id.parse::<i64>().ok())
        {
            Some(id) => {
                self.cancel(id);
            }
            None => tracing::debug!(payload, "ignoring an unknown control notification"),
        }
    }

    /// Ask the watcher to poll at once.
    pub(crate) fn poll_soon(&self) {
        self.poll_now.notify_one();
    }

    fn ids(&self) -> Vec<i64> {
        self.running
            .lock()
            .expect("cancel book")
            .keys()
            .copied()
            .collect()
    }
}

/// The watcher service: the poll fallback of cancel delivery. Every
/// `interval` (and at once after a listener (re)connect) it asks which of
/// the jobs this worker runs have a cancel request, and stops them; every
/// [`SWEEP_INTERVAL`] it removes requests whose job has finished.
pub(crate) struct Watcher {
    pool: deadpool_postgres::Pool,
    book: Arc<CancelBook>,
    interval: Duration,
}

impl Watcher {
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        book: Arc<CancelBook>,
        interval: Duration,
    ) -> Self {
        Watcher {
            pool,
            book,
            interval,
        }
    }

    /// Poll until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut last_sweep = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.book.poll_now.notified() => {}
                _ = tokio::time::sleep(self.interval) => {}
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_stops_only_the_watched_run_and_says_so() {
        let book = Arc::new(CancelBook::default());
        let parent = CancellationToken::new();
        let a = book.watch(1, &parent);
        let b = book.watch(2, &parent);
        book.on_notification("cancel 1");
        book.on_notification("cancel x");
        assert!(a.token().is_cancelled() && a.cancelled());
        assert!(!b.token().is_cancelled() && !b.cancelled());
        drop(a);
        assert!(!book.cancel(1), "an ended run is no longer in the book");
        parent.cancel();
        assert!(b.token().is_cancelled() && !b.cancelled());
    }

    #[test]
    fn outcomes_round_trip_the_sql_values() {
        for o in [
            CancelOutcome::Cancelled,
            CancelOutcome::Requested,
            CancelOutcome::Dead,
            CancelOutcome::Finished,
            CancelOutcome::NotFound,
        ] {
            assert_eq!(CancelOutcome::parse(o.as_str()).unwrap(), o);
        }
        assert!(CancelOutcome::parse("maybe").is_err());
    }
}
