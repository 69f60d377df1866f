//! Waiting registration: the worker tells producers, through
//! `pgwake.waiting_workers`, whether a NOTIFY would do any good. The insert
//! trigger only NOTIFYs when some live registration covers the queue, so
//! producers pay the NOTIFY commit lock only while a worker is actually idle.
//!
//! ```text
//!            a claim task hits (finds jobs)
//!   registered ─────────────────────────────▶ unregistered (draining)
//!        ▲                                           │
//!        │   no hit for LINGER, ≥1 task idle,        │
//!        └── listener up: register, then wake one ◀──┘
//!            task to re-check the queue
//! ```
//!
//! While any task keeps finding jobs (gaps under [`LINGER`]) the worker
//! stays unregistered: new rows are seen by its next claim, no NOTIFY
//! needed. After registering it waits until every transaction that was in
//! progress at that moment has ended (at most [`SETTLE_MAX`]; with durable
//! commits an insert's trigger runs about a WAL flush before its commit),
//! then re-checks the queue once, so a job whose trigger ran just before the
//! registration is not left waiting.
//!
//! The one window: a job whose inserting transaction ran the trigger
//! *before* the registration committed and stays open more than
//! [`SETTLE_MAX`] after it (e.g. `BEGIN; INSERT …; <other work>; COMMIT`
//! spanning the moment a worker goes idle). Such a job waits for the next
//! wake-up: a notification for a later insert, or the fallback poll (at
//! most `poll_interval` × 1.25).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::claim::choose::idle::WaitState;
use crate::claim::choose::wake::{Trigger, Wakeup};
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::health::Health;

/// Registrations expire unless renewed; a crashed worker's row stops
/// attracting notifications after this long.
pub(crate) const REGISTRATION_TTL: Duration = Duration::from_secs(30);
/// Longest wait, after registering, for producer transactions that were in
/// progress to end before the re-check claim.
pub(crate) const SETTLE_MAX: Duration = Duration::from_millis(100);
/// How often that wait looks again.
pub(crate) const SETTLE_POLL: Duration = Duration::from_millis(1);
/// How often a registration is renewed.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(10);

/// The registration service.
pub(crate) struct Registration {
    pool: deadpool_postgres::Pool,
    worker_id: String,
    queues: Option<Vec<String>>,
    state: Arc<WaitState>,
    wake: Arc<Wakeup>,
    health: Arc<Health>,
}

impl Registration {
    /// A registration for `worker_id` over `queues` (`None`: all).
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        worker_id: String,
        queues: Option<Vec<String>>,
        state: Arc<WaitState>,
        wake: Arc<Wakeup>,
        health: Arc<Health>,
    ) -> Registration {
        Registration {
            pool,
            worker_id,
            queues,
            state,
            wake,
            health,
        }
    }

    fn wanted(&self) -> (bool, Option<Duration>) {
        let draining = self.state.draining_for();
        let idle = self.state.idle.load(Ordering::SeqCst) > 0;
        (
            idle && draining.is_none() && self.health.listener_ok(),
            draining,
        )
    }

    /// Keep the registration in step with the worker's state until
    /// `shutdown`, then remove it.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut registered = false;
        let mut renewed = Instant::now();
        loop {
            let (want, draining) = self.wanted();
            let due = registered && renewed.elapsed() >= RENEW_EVERY;
            if want != registered || (want && due) {
                match self.apply(want).await {
                    Ok(()) => {
                        if want && !registered {
                            // Re-check: a job whose transaction ran the
                            // trigger before the registration committed sent
                            // no NOTIFY. Wait (briefly) for the transactions
                            // in progress at registration to end — with
                            // durable commits that is at least a WAL flush —
                            // then claim once.
                            if let Err(e) = self.settle().await {
                                tracing::debug!(error = %e, "waiting registration: settle failed");
                            }
                            self.wake.wake_one(Trigger::Poll);
                        }
                        registered = want;
                        renewed = Instant::now();
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "waiting registration failed");
                        // Unknown state: try to converge again soon.
                        registered = !want;
                        tokio::select! {
                            _ = shutdown.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                        }
                        continue;
                    }
                }
            }
            // Waiting on the listener to (re)connect: look again soon.
            let listener_pending = !registered && !self.health.listener_ok();
            let wait = match (draining, listener_pending) {
                (Some(d), _) => d,
                (None, true) => Duration::from_millis(50),
                (None, false) => RENEW_EVERY,
            };
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = self.state.changed.notified() => {}
                _ = tokio::time::sleep(wait) => {}
            }
        }
        if registered {
            let _ = self.apply(false).await;
        }
    }

    /// Wait until the transactions in progress right after the
    /// registration have ended, polling every [`SETTLE_POLL`], for at most
    /// [`SETTLE_MAX`] (a long producer transaction is the documented window).
    async fn settle(&self) -> Result<()> {
        let conn = crate::db::connect::PooledConn::get(&self.pool, "waiting registration").await?;
        let db = Db::unnamed(&conn);
        let snapshot: String = db
            .query_one(&sql::WAITING_SNAPSHOT, &[])
            .await
            .map_err(Error::db("waiting registration: snapshot"))?
            .get(0);
        let deadline = Instant::now() + SETTLE_MAX;
        loop {
            let settled: bool = db
                .query_one(&sql::WAITING_SETTLED, &[&snapshot])
                .await
                .map_err(Error::db("waiting registration: settle"))?
                .get(0);
            if settled || Instant::now() >= deadline {
                return Ok(());
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
    }

    async fn apply(&self, register: bool) -> Result<()> {
        let mut conn =
            crate::db::connect::PooledConn::get(&self.pool, "waiting registration").await?;
        if register {
            let r = Db::unnamed(&conn)
                .execute(
                    &sql::WAITING_REGISTER,
                    &[
                        &self.worker_id,
                        &self.queues,
                        &REGISTRATION_TTL.as_secs_f64(),
                    ],
                )
                .await;
            conn.check(r).map_err(Error::db("waiting registration"))?;
        } else {
            let r = Db::unnamed(&conn)
                .execute(&sql::WAITING_UNREGISTER, &[&self.worker_id])
                .await;
            conn.check(r).map_err(Error::db("waiting registration"))?;
        }
        Ok(())
    }
}
