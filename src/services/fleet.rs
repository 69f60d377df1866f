//! The worker registry (`pgwake.workers`, migration 0016): this worker's
//! row, renewed every [`RENEW_EVERY`] with the number of jobs it runs and
//! removed when it stops. A process killed without removing it drops out of
//! `pgwake.live_workers` when its row expires ([`TTL`] after the last
//! renewal). The registry says which workers are alive and what they serve
//! (`pgwake stats`, the console), and so which waiting jobs no live worker
//! can run: this service also samples those (`pgwake.unserved_jobs()`) into
//! the `pgwake_jobs_unserved` gauge every [`UNSERVED_EVERY`] (every
//! [`UNSERVED_EVERY_UNDER_PRESSURE`] while the vacuum horizon is held). With each
//! renewal goes a snapshot of the persistent handlers' processes (migration
//! 0029): how many live, jobs in flight, restarts, and jobs waiting for a
//! process with room, for the console and `pgwake explain`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::admin::workers::ProcessPool;
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::handler::Handler;
use crate::metrics;

/// How long a row counts as alive after its last renewal: a worker killed
/// with -9 disappears from `pgwake.live_workers` within this bound.
pub(crate) const TTL: Duration = Duration::from_secs(30);
/// How often the row is renewed.
pub(crate) const RENEW_EVERY: Duration = Duration::from_secs(10);
/// How often the unserved jobs are sampled.
pub(crate) const UNSERVED_EVERY: Duration = Duration::from_secs(30);
/// How often while claims resume after their cursor (a transaction open
/// 5 s, or the governor's level above ok): the sample reads the head of
/// every (queue, priority) range, where a held horizon keeps the entries
/// of every job claimed since (107 ms a sample, up to 353 ms, over three
/// pinned minutes at 1,500 jobs/s; docs/src/performance.md, "Where the
/// producers' latency goes").
pub(crate) const UNSERVED_EVERY_UNDER_PRESSURE: Duration = Duration::from_secs(300);
/// How long between two samples of the unserved jobs: longer while claims
/// resume after their cursor (`pressed`).
fn unserved_every(pressed: bool) -> Duration {
    if pressed {
        UNSERVED_EVERY_UNDER_PRESSURE
    } else {
        UNSERVED_EVERY
    }
}

/// Jobs looked at per queue and priority when sampling unserved jobs.
const UNSERVED_HEAD: i32 = 10;
/// (queue, priority) pairs looked at, at most.
const UNSERVED_PAIRS_MAX: i32 = 2000;
/// Pools of processes written to the registry, at most.
const POOLS_MAX: usize = 32;
/// Task names listed per pool, at most.
const POOL_TASKS_MAX: usize = 16;
/// Bytes of the processes JSON, at most (the column allows 64 kB of
/// jsonb text, which adds a space after each `:` and `,`).
const PROCESSES_BYTES_MAX: usize = 32 * 1024;

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
    /// Handlers by task, asked for their processes at every renewal.
    handlers: Vec<(String, Arc<dyn Handler>)>,
    /// Whether claims resume after their cursor (the unserved jobs are
    /// then sampled every [`UNSERVED_EVERY_UNDER_PRESSURE`]).
    health: Option<Arc<crate::health::Health>>,
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
            handlers: Vec::new(),
            health: None,
        }
    }

    /// Sample the unserved jobs less often while `health` says claims
    /// resume after their cursor.
    pub(crate) fn with_health(mut self, health: Arc<crate::health::Health>) -> Membership {
        self.health = Some(health);
        self
    }

    /// Report the processes of these handlers (by task) with each renewal.
    pub(crate) fn with_handlers(mut self, handlers: Vec<(String, Arc<dyn Handler>)>) -> Membership {
        self.handlers = handlers;
        self
    }

    /// Keep the row until `shutdown`, then remove it.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        let mut sampled: Option<Instant> = None;
        let mut unserved: HashSet<(String, String)> = HashSet::new();
        loop {
            if let Err(e) = self.register().await {
                tracing::warn!(error = %e, "worker registry: cannot renew this worker's row");
            }
            let pressed = self.health.as_ref().is_some_and(|h| h.claims_resume());
            if sampled.is_none_or(|t| t.elapsed() >= unserved_every(pressed)) {
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
                    &processes(&self.handlers),
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

/// The processes of `handlers` as the registry's JSON: one entry per pool
/// (handlers sharing a pool are one entry, with all their tasks), in
/// command order, cut to [`POOLS_MAX`] entries, [`POOL_TASKS_MAX`] tasks
/// each and [`PROCESSES_BYTES_MAX`] bytes.
fn processes(handlers: &[(String, Arc<dyn Handler>)]) -> String {
    let mut by_pool: Vec<(usize, ProcessPool)> = Vec::new();
    for (task, h) in handlers {
        let Some(p) = h.processes() else { continue };
        let entry = match by_pool.iter_mut().find(|(k, _)| *k == p.pool) {
            Some((_, e)) => e,
            None => {
                by_pool.push((
                    p.pool,
                    ProcessPool {
                        command: p.command,
                        live: p.live as u64,
                        processes: p.configured as u64,
                        in_flight: p.in_flight as u64,
                        capacity: p.capacity as u64,
                        restarts: p.restarts,
                        waiting: p.waiting as u64,
                        ..ProcessPool::default()
                    },
                ));
                &mut by_pool.last_mut().expect("pushed").1
            }
        };
        if entry.tasks.len() < POOL_TASKS_MAX {
            entry.tasks.push(task.clone());
        }
    }
    let mut pools: Vec<ProcessPool> = by_pool.into_iter().map(|(_, p)| p).collect();
    pools.sort_by(|a, b| a.command.cmp(&b.command));
    pools.truncate(POOLS_MAX);
    for p in &mut pools {
        p.tasks.sort();
    }
    loop {
        let text = serde_json::to_string(&pools).unwrap_or_else(|_| "[]".into());
        if text.len() <= PROCESSES_BYTES_MAX || pools.is_empty() {
            return text;
        }
        pools.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_pressure_the_unserved_jobs_are_sampled_ten_times_less_often() {
        assert_eq!(unserved_every(false), UNSERVED_EVERY);
        assert_eq!(unserved_every(true), 10 * UNSERVED_EVERY);
    }

    use async_trait::async_trait;

    use crate::handler::{BoxError, HandlerProcesses, JobContext};
    use crate::job::{Job, Outcome};

    struct Kept(usize, &'static str, usize);

    #[async_trait]
    impl Handler for Kept {
        async fn handle(
            &self,
            _: &Job,
            _: JobContext<'_>,
        ) -> std::result::Result<Outcome, BoxError> {
            Ok(Outcome::Done)
        }

        fn processes(&self) -> Option<HandlerProcesses> {
            Some(HandlerProcesses {
                pool: self.0,
                command: self.1.into(),
                live: 1,
                configured: 2,
                in_flight: self.2,
                capacity: 4,
                restarts: 0,
                waiting: 0,
            })
        }
    }

    struct Plain;

    #[async_trait]
    impl Handler for Plain {
        async fn handle(
            &self,
            _: &Job,
            _: JobContext<'_>,
        ) -> std::result::Result<Outcome, BoxError> {
            Ok(Outcome::Done)
        }
    }

    #[test]
    fn a_pool_shared_by_tasks_is_listed_once_with_its_tasks() {
        let shared: Arc<dyn Handler> = Arc::new(Kept(1, "python3 app.py", 3));
        let handlers: Vec<(String, Arc<dyn Handler>)> = vec![
            ("b".into(), shared.clone()),
            ("a".into(), Arc::new(Kept(1, "python3 app.py", 3))),
            ("c".into(), Arc::new(Kept(2, "node app.mjs", 0))),
            ("d".into(), Arc::new(Plain)),
        ];
        let v: Vec<ProcessPool> = serde_json::from_str(&processes(&handlers)).unwrap();
        assert_eq!(v.len(), 2);
        assert_eq!(
            (v[0].command.as_str(), &v[0].tasks[..]),
            ("node app.mjs", &["c".to_string()][..])
        );
        assert_eq!(v[1].tasks, ["a", "b"]);
        assert_eq!(
            (v[1].live, v[1].processes, v[1].in_flight, v[1].capacity),
            (1, 2, 3, 4)
        );
        assert_eq!(
            processes(&[("d".into(), Arc::new(Plain) as Arc<dyn Handler>)]),
            "[]"
        );
    }

    #[test]
    fn the_snapshot_stays_within_its_bounds() {
        let long = Box::leak("x".repeat(2000).into_boxed_str());
        let handlers: Vec<(String, Arc<dyn Handler>)> = (0..100)
            .flat_map(|i| (0..40).map(move |t| (format!("{i}-{t}-{}", "t".repeat(150)), i)))
            .map(|(task, i)| (task, Arc::new(Kept(i, long, 0)) as Arc<dyn Handler>))
            .collect();
        let text = processes(&handlers);
        let v: Vec<ProcessPool> = serde_json::from_str(&text).unwrap();
        assert!(
            text.len() <= PROCESSES_BYTES_MAX && !v.is_empty(),
            "{}",
            text.len()
        );
        assert!(v.len() <= POOLS_MAX && v.iter().all(|p| p.tasks.len() <= POOL_TASKS_MAX));
    }
}
