//! The worker: builder, start-up checks, and the supervisor that owns the
//! services (listener, poller, claim tasks, sampler) and joins them all on
//! shutdown.
//!
//! Shutdown (DESIGN.md §4): `stop` → claim nothing more, start no new job;
//! running jobs get `grace_period`; then (or at once on `abort`, the second
//! signal) they are interrupted and handed back without using an attempt;
//! outcomes are committed before the pool closes. If a handler ignores
//! cancellation (blocks its thread), the worker still returns after
//! [`HARD_DEADLINE`]; the server rolls its transaction back.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::claimer::{JobEvent, Shared};
use crate::config::WorkerConfig;
use crate::connect;
use crate::error::{Error, Result};
use crate::handler::{Handler, Registry};
use crate::health::Health;
use crate::listener::{Listener, ListenerConfig};
use crate::poller::{Poller, Schedule};
use crate::rescuer::Rescuer;
use crate::sampler::Sampler;
use crate::wake::Wakeup;

/// After the grace period and the abort, how long the supervisor still waits
/// for claim tasks to hand their jobs back before it returns regardless.
pub const HARD_DEADLINE: Duration = Duration::from_secs(5);

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    db: tokio_postgres::Config,
    config: WorkerConfig,
    registry: Registry,
}

impl WorkerBuilder {
    /// Use `config` (see [`WorkerConfig`] for every setting).
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Run jobs of `task` with `handler`; `*` is the catch-all.
    pub fn handler(mut self, task: &str, handler: impl Handler) -> Self {
        self.registry.insert(task, Arc::new(handler));
        self
    }

    /// Same as [`WorkerBuilder::handler`] for a shared handler.
    pub fn handler_arc(mut self, task: &str, handler: Arc<dyn Handler>) -> Self {
        self.registry.insert(task, handler);
        self
    }

    /// Validate the configuration and build the worker (no I/O yet).
    pub fn build(self) -> Result<Worker> {
        self.config.validate()?;
        if self.registry.is_empty() {
            return Err(Error::Config(
                "no handlers: register at least one (--handler TASK=exec:COMMAND, TASK=sql:FUNCTION, or `*`)".into(),
            ));
        }
        let (events, _) = broadcast::channel(4096);
        Ok(Worker {
            health: Arc::new(Health::new(self.config.listen)),
            db: self.db,
            config: self.config,
            registry: self.registry,
            events,
        })
    }
}

/// A pgwake worker.
pub struct Worker {
    db: tokio_postgres::Config,
    config: WorkerConfig,
    registry: Registry,
    events: broadcast::Sender<JobEvent>,
    health: Arc<Health>,
}

impl Worker {
    /// Start building a worker for the database `db`.
    pub fn builder(db: tokio_postgres::Config) -> WorkerBuilder {
        WorkerBuilder {
            db,
            config: WorkerConfig::default(),
            registry: Registry::default(),
        }
    }

    /// Events for every job outcome, after it is committed. Lagging
    /// receivers lose events, never jobs.
    pub fn subscribe(&self) -> broadcast::Receiver<JobEvent> {
        self.events.subscribe()
    }

    /// Readiness state, for an HTTP endpoint.
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// The configuration in force.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Check the database (reachable, schema current, handlers valid) and
    /// run until `stop` is cancelled; `abort` (the second signal) skips the
    /// grace period. Returns `Ok` after a clean shutdown.
    pub async fn run(self, stop: CancellationToken, abort: CancellationToken) -> Result<()> {
        let app = &self.config.application_name;
        let db = connect::with_application_name(&self.db, app);
        {
            let client = connect::connect(&db).await?;
            crate::schema::check(&client).await?;
            for task in self.registry_tasks() {
                if let Some(h) = self.registry.get(&task) {
                    h.check(&client)
                        .await
                        .map_err(|e| Error::Config(e.to_string()))?;
                }
            }
        }
        self.health.set_db(true);
        let pool = connect::pool(&db, self.config.concurrency + 2)?;
        let mut attempts_db = connect::with_application_name(&self.db, &format!("{app}-ledger"));
        // Losing a pending attempt count in a server crash is harmless (see
        // migrations/0001); not waiting for its fsync keeps claims fast.
        attempts_db.options("-c synchronous_commit=off");
        let attempts_pool = connect::pool(&attempts_db, 2)?;

        let wake = Arc::new(Wakeup::default());
        let schedule = Arc::new(Schedule::default());
        let service_stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            begin_sql: crate::txmode::begin_sql(&self.config),
            config: self.config.clone(),
            pool: pool.clone(),
            attempts_pool: attempts_pool.clone(),
            registry: self.registry.clone(),
            wake: wake.clone(),
            schedule: schedule.clone(),
            health: self.health.clone(),
            events: self.events.clone(),
            stop: stop.clone(),
            abort: abort.clone(),
            tx_queues: self.config.tx_queues(),
            lease_queues: self.config.lease_queues.clone(),
            worker_id: worker_id(),
        });

        let mut services = JoinSet::new();
        if self.config.listen {
            let listener = Listener::new(
                ListenerConfig {
                    db: connect::with_application_name(&self.db, &format!("{app}-listener")),
                    queues: self.worked_queues().map(|q| q.into_iter().collect::<HashSet<_>>()),
                    ping_interval: self.config.listener_ping_interval,
                    ping_timeout: self.config.listener_ping_timeout,
                    reconnect_min: self.config.reconnect_min,
                    reconnect_max: self.config.reconnect_max,
                },
                wake.clone(),
                self.health.clone(),
            );
            services.spawn(listener.run(service_stop.clone()));
        } else {
            // Poll-only: nobody else wakes the tasks at start.
            wake.wake_all(crate::wake::Trigger::Poll);
        }
        let poller = Poller::new(
            pool.clone(),
            self.worked_queues(),
            self.config.poll_interval,
            wake.clone(),
            schedule.clone(),
        );
        services.spawn(poller.run(service_stop.clone()));
        let rescuer = Rescuer::new(pool.clone(), self.config.rescue_interval);
        services.spawn(rescuer.run(service_stop.clone()));
        if let Some(interval) = self.config.sample_interval {
            let sampler = Sampler::new(pool.clone(), interval, self.health.clone());
            services.spawn(sampler.run(service_stop.clone()));
        }

        let mut claimers = JoinSet::new();
        for _ in 0..self.config.concurrency {
            claimers.spawn(crate::claimer::run_task(shared.clone()));
        }
        tracing::info!(
            database = %connect::describe(&self.db),
            concurrency = self.config.concurrency,
            batch = self.config.batch,
            listen = self.config.listen,
            queues = ?self.config.queues,
            "worker started"
        );

        stop.cancelled().await;
        tracing::info!(grace = ?self.config.grace_period, "shutting down: no new claims, waiting for running jobs");
        let drained = tokio::select! {
            _ = join_all(&mut claimers) => true,
            _ = tokio::time::sleep(self.config.grace_period) => false,
            _ = abort.cancelled() => false,
        };
        if !drained {
            tracing::warn!("grace period over: interrupting running jobs and handing them back");
            abort.cancel();
            if tokio::time::timeout(HARD_DEADLINE, join_all(&mut claimers))
                .await
                .is_err()
            {
                tracing::error!("claim tasks did not stop within the hard deadline; leaving them to the server's rollback");
                claimers.abort_all();
            }
        }
        service_stop.cancel();
        join_all(&mut services).await;
        pool.close();
        attempts_pool.close();
        tracing::info!("worker stopped");
        Ok(())
    }

    /// Every queue this worker claims from (`None`: all).
    fn worked_queues(&self) -> Option<Vec<String>> {
        self.config.queues.as_ref().map(|q| {
            let mut all = q.clone();
            for l in &self.config.lease_queues {
                if !all.contains(l) {
                    all.push(l.clone());
                }
            }
            all
        })
    }

    fn registry_tasks(&self) -> Vec<String> {
        self.registry.tasks()
    }
}

async fn join_all(set: &mut JoinSet<()>) {
    while let Some(r) = set.join_next().await {
        if let Err(e) = r {
            if e.is_panic() {
                tracing::error!(error = %e, "a worker task panicked");
            }
        }
    }
}

/// `host:pid:random`, unique per worker process run; stored with each lease.
fn worker_id() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // or truncates.
    let host = if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".into()
    };
    format!("{host}:{}:{:08x}", std::process::id(), rand::random::<u32>())
}
