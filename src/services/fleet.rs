//! The worker registry (`pgwake.workers`, migration 0016): this worker's
//! row, renewed every [`RENEW_EVERY`] with the number of jobs it runs and
//! removed when it stops. A process killed without removing it drops out of
//! `pgwake.live_workers` when its row expires ([`TTL`] after the last
//! renewal). The registry says which workers are alive and what they serve
//! (`pgwake stats`, the console), and so which waiting jobs no live worker
//! can run: this service also samples those (`pgwake.unserved_jobs()`) into
//! the `pgwake_jobs_unserved` gauge every [`UNSERVED_EVERY`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::metrics;

/// How long a row counts as alive after its last renewal: a worker killed
/// with -9 disappears from `pgwake.live_workers` within this bound.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// How often the row is renewed.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often the unserved jobs are sampled.
pub(crate) const UNSERVED_EVERY: Duration = Duration::from_secs(30);
/// Jobs looked at per queue and priority when sampling unserved jobs.
const UNSERVED_HEAD: i32 = 10;
/// (queue, priority) pairs looked at, at most.
const UNSERVED_PAIRS_MAX: i32 = 2000;

/// What this worker tells the registry about itself.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub id: String,
    pub host: String,
    pub version: String,
    pub application_name: String,
    /// `None`: every queue.
    pub queues: Option<Vec<String>>,
    /// Task names with a handler (`*`: a catch-all).
    pub tasks: Vec<String>,
    /// `[{"task": …, "mode": …}]`.
    pub handlers: serde_json::Value,
    pub concurrency: usize,
}

/// The registry service.
pub(crate) struct Membership {
    pool: deadpool_postgres::Pool,
    member: Member,
    slots: Arc<Semaphore>,
}

impl Membership {
    /// `slots`: the worker's job slots (running = concurrency − free).
    pub(crate) fn new(
        pool: deadpool_postgres::Pool,
        member: Member,
        slots: Arc<Semaphore>,
    ) -> Membership {
        Membership {
            pool,
            member,
            slots,
        }
    }

    /// Keep the row until `shutdown`, then remove it.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut sampled: Option<Instant> = None;
        let mut unserved: HashSet<(String, String)> = HashSet::new();
        loop {
            if let Err(e) = self.register().await {
                tracing::warn!(error = %e, "worker registry: cannot renew this worker's row");
            }
            if sampled.is_none_or(|t| t.elapsed() >= UNSERVED_EVERY) {
                match self.sample_unserved(&mut unserved).await {
                    Ok(()) => sampled = Some(Instant::now()),
                    Err(e) => {
                        tracing::warn!(error = %e, "worker registry: cannot sample unserved jobs")
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(RENEW_EVERY) => {}
            }
        }
        if let Err(e) = self.unregister().await {
            tracing::debug!(error = %e, "worker registry: cannot remove this worker's row (it expires)");
        }
    }

    async fn register(&self) -> Result<()> {
        let m = &self.member;
        let running = m
            .concurrency
            .saturating_sub(self.slots.available_permits())
            .min(i32::MAX as usize) as i32;
        let mut conn = crate::db::connect::PooledConn::get(&self.pool, "worker registry").await?;
        let r = Db::unnamed(&conn)
            .execute(
                &sql::WORKER_REGISTER,
                &[
                    &m.id,
                    &m.host,
                    &(std::process::id() as i32),
                    &m.version,
                    &m.application_name,
                    &m.queues,
                    &m.tasks,
                    &m.handlers.to_string(),
                    &(m.concurrency.min(i32::MAX as usize) as i32),
                    &running,
                    &TTL.as_secs_f64(),
                ],
            )
            .await;
        conn.check(r).map_err(Error::db("worker registry"))?;
        Ok(())
    }

    async fn unregister(&self) -> Result<()> {
        let mut conn = crate::db::connect::PooledConn::get(&self.pool, "worker registry").await?;
        let r = Db::unnamed(&conn)
            .execute(&sql::WORKER_UNREGISTER, &[&self.member.id])
            .await;
        conn.check(r).map_err(Error::db("worker registry"))?;
        Ok(())
    }

    /// Set `pgwake_jobs_unserved` per queue and task; pairs seen last time
    /// and not now go back to 0.
    async fn sample_unserved(&self, last: &mut HashSet<(String, String)>) -> Result<()> {
        let mut conn = crate::db::connect::PooledConn::get(&self.pool, "unserved jobs").await?;
        let r = crate::admin::workers::unserved(&conn, UNSERVED_HEAD, UNSERVED_PAIRS_MAX).await;
        let rows = conn.check(r).map_err(Error::db("unserved jobs"))?;
        let mut now = HashSet::new();
        for u in rows {
            let key = (metrics::queue_label(&u.queue), metrics::task_label(&u.task));
            ::metrics::gauge!(metrics::JOBS_UNSERVED, "queue" => key.0.clone(), "task" => key.1.clone())
                .set(u.jobs as f64);
            now.insert(key);
        }
        for (queue, task) in last.difference(&now) {
            ::metrics::gauge!(metrics::JOBS_UNSERVED, "queue" => queue.clone(), "task" => task.clone())
                .set(0.0);
        }
        *last = now;
        Ok(())
    }
}
