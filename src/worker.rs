//! The worker: builder, start-up checks, and the supervisor that owns the
//! services (listener, poller, claim tasks, sampler) and joins them all on
//! shutdown.
//!
//! Shutdown (docs/src/deploying.md, "The shutdown timeline"): `stop` → claim nothing more, start no new job;
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

use crate::claim::{Claims, Setup, Shared};
use crate::config::WorkerConfig;
use crate::db::connect;
use crate::error::{Error, Result};
use crate::handler::{Handler, Registry};
use crate::health::Health;
use crate::services::listener::{Listener, ListenerConfig};
use crate::services::poller::Poller;
use crate::services::rescuer::Rescuer;
use crate::services::sampler::Sampler;
use crate::JobEvent;

/// After the grace period and the abort, how long the supervisor still waits
/// for claim tasks to hand their jobs back before it returns regardless.
pub(crate) const HARD_DEADLINE: Duration = Duration::from_secs(5);

/// While the schema's state does not change, how often the wait for it is
/// logged again.
const SCHEMA_WAIT_LOG_EVERY: Duration = Duration::from_secs(60);

/// What the start-up check found.
enum StartUp {
    /// Everything is in place: how the claims go over the connection.
    Ready(connect::Pooling),
    /// The schema waits for `pgwake migrate`.
    SchemaPending(crate::admin::schema::Pending),
}

/// Builds a [`Worker`].
pub struct WorkerBuilder {
    db: connect::DbConfig,
    listen_db: Option<connect::DbConfig>,
    config: WorkerConfig,
    registry: Registry,
    duplicates: Vec<String>,
}

impl WorkerBuilder {
    /// Use `config` (see [`WorkerConfig`] for every setting).
    pub fn config(mut self, config: WorkerConfig) -> Self {
        self.config = config;
        self
    }

    /// Run jobs of `task` with `handler`; `*` is the catch-all.
    /// Registering a second handler for the same task makes
    /// [`WorkerBuilder::build`] fail.
    pub fn handler(self, task: &str, handler: impl Handler) -> Self {
        self.handler_arc(task, Arc::new(handler))
    }

    /// Same as [`WorkerBuilder::handler`] for a shared handler.
    pub fn handler_arc(mut self, task: &str, handler: Arc<dyn Handler>) -> Self {
        if !self.registry.insert(task, handler) {
            self.duplicates.push(task.to_string());
        }
        self
    }

    /// LISTEN through a different connection than the claims use: e.g.
    /// claims through PgBouncer in transaction mode (which cannot LISTEN)
    /// and LISTEN directly to the server. Default: the same database.
    pub fn listen_database(mut self, db: impl Into<connect::DbConfig>) -> Self {
        self.listen_db = Some(db.into());
        self
    }

    /// Validate the configuration and build the worker (no I/O yet).
    pub fn build(self) -> Result<Worker> {
        self.config.validate()?;
        if let Some(task) = self.duplicates.first() {
            return Err(Error::Config(format!(
                "--handler: task {task:?} has more than one handler; give each task exactly one"
            )));
        }
        if self.registry.is_empty() {
            return Err(Error::Config(
                "no handlers: register at least one (--handler TASK=exec:COMMAND, TASK=sql:FUNCTION, or `*`)".into(),
            ));
        }
        let (events, _) = broadcast::channel(4096);
        // Whether any claim is in tx mode: its running batches hold a
        // claim connection each, so the default pool grows with the slots.
        let tx = crate::claim::uses(&self.config, &self.registry, crate::handler::Delivery::Tx);
        let app = &self.config.application_name;
        let db = connect::with_application_name(&self.db, app);
        // Pools connect lazily: building them does no I/O.
        // Slots are not connections: claim tasks, heartbeats and outcome
        // writes share these (config.rs: `connections`).
        let pool = connect::pool(&db, self.config.connections(tx))?;
        // Batch marks and crash charges (claim/tx/ledger.rs): committed durably, on
        // connections outside any claim transaction.
        let ledger_db = connect::with_application_name(&self.db, &format!("{app}-ledger"));
        let ledger_pool = connect::pool(&ledger_db, 2)?;
        let listen_db = self.listen_db.unwrap_or_else(|| self.db.clone());
        Ok(Worker {
            health: Arc::new(Health::new(self.config.listen)),
            db,
            listen_db,
            pool,
            ledger_pool,
            config: self.config,
            registry: self.registry,
            events,
            worker_id: worker_id(),
            tx,
            shared: Shared::default(),
        })
    }
}

/// A pgwake worker.
pub struct Worker {
    db: connect::DbConfig,
    listen_db: connect::DbConfig,
    pool: deadpool_postgres::Pool,
    ledger_pool: deadpool_postgres::Pool,
    worker_id: String,
    /// Whether the worker has tx-mode claims (see `WorkerConfig::connections`).
    tx: bool,
    /// What the claim path shares with the services and the start-up check.
    shared: Shared,
    config: WorkerConfig,
    registry: Registry,
    events: broadcast::Sender<JobEvent>,
    health: Arc<Health>,
}

impl Worker {
    /// Start building a worker for the database `db`.
    pub fn builder(db: impl Into<connect::DbConfig>) -> WorkerBuilder {
        WorkerBuilder {
            db: db.into(),
            listen_db: None,
            config: WorkerConfig::default(),
            registry: Registry::default(),
            duplicates: Vec::new(),
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
    pub async fn run(mut self, stop: CancellationToken, abort: CancellationToken) -> Result<()> {
        let Some(pooling) = self.wait_for_database(&stop).await? else {
            tracing::info!("stopped while waiting to start (for the database or its schema)");
            return Ok(());
        };
        self.config.prepared_statements = pooling.prepared;
        if self.config.listen && !pooling.listen {
            self.config.listen = false;
            self.health.set_listen(false);
        }
        let mut claims = Claims::new(self.setup(), stop.clone(), abort);
        self.init_metrics(&claims);
        self.health.set_db(true);

        let service_stop = CancellationToken::new();
        let mut services = JoinSet::new();
        self.spawn_wakers(&claims, &mut services, &service_stop);
        self.spawn_maintenance(&claims, &mut services, &service_stop);
        let tasks = self.config.claim_tasks(self.tx);
        claims.start(tasks);
        tracing::info!(
            database = %connect::describe(&self.db),
            concurrency = self.config.concurrency,
            connections = self.config.connections(self.tx),
            prefetch = %claims.describe_prefetch(),
            batch = self.config.batch,
            listen = self.config.listen,
            queues = %self.config.queues_label(),
            modes = %crate::claim::describe_modes(&self.config, &self.registry),
            "worker started"
        );
        self.say_tx_bound(tasks);

        stop.cancelled().await;
        tracing::info!(grace = ?self.config.grace_period, "shutting down: no new claims, waiting for running jobs");
        claims
            .shut_down(self.config.grace_period, HARD_DEADLINE)
            .await;
        service_stop.cancel();
        join_all(&mut services).await;
        self.pool.close();
        self.ledger_pool.close();
        tracing::info!("worker stopped");
        Ok(())
    }

    /// What the claim path is built from.
    fn setup(&self) -> Setup<'_> {
        Setup {
            config: &self.config,
            registry: &self.registry,
            pool: &self.pool,
            ledger_pool: &self.ledger_pool,
            health: &self.health,
            events: &self.events,
            worker_id: &self.worker_id,
            shared: &self.shared,
            tx: self.tx,
        }
    }

    /// The label values known at start (`metrics::init_known`).
    fn init_metrics(&self, claims: &Claims) {
        crate::metrics::init_known(crate::metrics::Known {
            queues: &self
                .config
                .queues
                .clone()
                .unwrap_or_else(|| vec!["default".into()]),
            forced_queues: &[
                self.config.lease_queues.clone(),
                self.config.tx_queues.clone(),
            ]
            .concat(),
            tasks: &self.registry.tasks(),
            application: &self.config.application_name,
            scheduler: self.config.scheduler.is_some(),
            modes: &claims.modes(),
        });
    }

    /// The services that wake the claim tasks or stop their jobs: the
    /// listener and the waiting registration (or, poll-only, one wake-up
    /// of every task now), the poller and the cancel watcher.
    fn spawn_wakers(
        &self,
        claims: &Claims,
        services: &mut JoinSet<()>,
        service_stop: &CancellationToken,
    ) {
        let pool = &self.pool;
        let app = &self.config.application_name;
        if self.config.listen {
            let listener = Listener::new(
                ListenerConfig {
                    db: connect::with_application_name(&self.listen_db, &format!("{app}-listener")),
                    queues: self
                        .worked_queues()
                        .map(|q| q.into_iter().collect::<HashSet<_>>()),
                    ping_interval: self.config.listener_ping_interval,
                    ping_timeout: self.config.listener_ping_timeout,
                    reconnect_min: self.config.reconnect_min,
                    reconnect_max: self.config.reconnect_max,
                },
                claims.wake(),
                self.health.clone(),
                claims.cancels(),
            );
            services.spawn(listener.run(service_stop.clone()));
            let registration = crate::services::waiting::Registration::new(
                pool.clone(),
                self.worker_id.clone(),
                self.worked_queues(),
                self.shared.wait_state.clone(),
                claims.wake(),
                self.health.clone(),
            );
            services.spawn(registration.run(service_stop.clone()));
        } else {
            // Poll-only: nobody else wakes the tasks at start.
            claims.wake_all();
        }
        let poller = Poller::new(
            pool.clone(),
            crate::services::poller::PollerConfig {
                interval: self.config.poll_interval,
                queues: self.worked_queues(),
            },
            claims.wake(),
            claims.schedule(),
        );
        services.spawn(poller.run(service_stop.clone()));
        // Cancel requests: the fallback for notifications the listener
        // missed. Stops with the services, after every job has ended.
        let watcher = crate::services::cancel_watcher::Watcher::new(
            pool.clone(),
            claims.cancels(),
            crate::services::cancel_watcher::WatcherConfig {
                interval: self.config.cancel_poll_interval,
            },
        );
        services.spawn(watcher.run(service_stop.clone()));
    }

    /// The services beside the claims: fleet membership, the rescuer, the
    /// history's maintenance, and (when configured) the rollup, the
    /// scheduler and the sampler.
    fn spawn_maintenance(
        &self,
        claims: &Claims,
        services: &mut JoinSet<()>,
        service_stop: &CancellationToken,
    ) {
        let pool = &self.pool;
        let member = crate::services::fleet::Member {
            id: self.worker_id.clone(),
            host: hostname(),
            version: env!("CARGO_PKG_VERSION").into(),
            application_name: self.config.application_name.clone(),
            queues: self.worked_queues(),
            tasks: self.registry.tasks(),
            handlers: self
                .registry
                .tasks()
                .iter()
                .filter_map(|t| {
                    self.registry
                        .get(t)
                        .map(|h| serde_json::json!({"task": t, "mode": h.delivery().as_str()}))
                })
                .collect(),
            concurrency: self.config.concurrency,
        };
        services.spawn(
            crate::services::fleet::Membership::new(pool.clone(), member, claims.slots())
                .with_health(self.health.clone())
                .with_handlers(
                    self.registry
                        .tasks()
                        .into_iter()
                        .filter_map(|t| self.registry.get(&t).map(|h| (t, h.clone())))
                        .collect(),
                )
                .run(service_stop.clone()),
        );
        let rescuer = Rescuer::new(
            pool.clone(),
            crate::services::rescuer::RescuerConfig::every(self.config.rescue_interval),
        );
        services.spawn(rescuer.run(service_stop.clone()));
        let history =
            crate::services::history::Maintenance::new(pool.clone(), self.config.history.clone())
                .with_switch(self.shared.history.clone());
        services.spawn(history.run(service_stop.clone()));
        if let Some(config) = &self.config.rollup {
            // Stopped with the services, after the last outcome is
            // reported: its last flush counts every job this worker ran.
            let rollup = crate::services::rollup::Rollup::new(
                pool.clone(),
                config.clone(),
                self.shared.rollup.clone(),
            );
            services.spawn(rollup.run(service_stop.clone()));
        }
        if let Some(config) = &self.config.scheduler {
            let scheduler =
                crate::services::scheduler::Scheduler::new(pool.clone(), config.clone());
            services.spawn(scheduler.run(service_stop.clone()));
        }
        if let Some(interval) = self.config.sample_interval {
            let sampler = Sampler::new(
                pool.clone(),
                crate::services::sampler::SamplerConfig {
                    depth_minutes: self.config.rollup.is_some(),
                    horizon_held_claims: self.config.horizon_held_claims,
                    ..crate::services::sampler::SamplerConfig::every(interval)
                },
                self.health.clone(),
            );
            services.spawn(sampler.run(service_stop.clone()));
        }
    }

    /// Start-up checks: the database answers, the schema is this binary's,
    /// every handler is usable, and a transaction-mode pooler in front of
    /// the claims gets what it can carry (`connect::check_pooling`). Also
    /// applies `config.history.keep_finished` to the database and reads the
    /// history setting in force.
    ///
    /// A schema that is missing, older, or being migrated is an
    /// [`Error::Schema`] here; [`run`](Self::run) waits for it instead.
    pub async fn check(&self) -> Result<()> {
        match self.start_up_check().await? {
            StartUp::Ready(_) => Ok(()),
            StartUp::SchemaPending(p) => Err(Error::Schema(p.to_string())),
        }
    }

    /// [`check`](Self::check), returning how the claims go over the
    /// connection (the start-up check decides `--prepared-statements auto`
    /// and whether LISTEN can work), or what the schema waits for.
    async fn start_up_check(&self) -> Result<StartUp> {
        let client = connect::connect(&self.db).await?;
        // One transaction: through a transaction-mode pooler its statements
        // (named ones among them) all run on one server connection.
        client
            .batch_execute("BEGIN")
            .await
            .map_err(Error::db("start-up check"))?;
        // Dropping the connection on a pending schema rolls back (nothing
        // was written); the migration lock, taken shared, goes with it.
        if let Some(p) = crate::admin::schema::pending(&client).await? {
            return Ok(StartUp::SchemaPending(p));
        }
        let keep = crate::admin::history::apply(&client, self.config.history.keep_finished).await?;
        self.shared.history.set(keep.is_some());
        for task in self.registry.tasks() {
            if let Some(h) = self.registry.get(&task) {
                h.check(&client)
                    .await
                    .map_err(|e| Error::Config(e.to_string()))?;
            }
        }
        // COMMIT, not ROLLBACK: `history::apply` above may have changed the
        // history setting (--keep-finished).
        client
            .batch_execute("COMMIT")
            .await
            .map_err(Error::db("start-up check"))?;
        let listen_through_pool = connect::describe(&self.listen_db) == connect::describe(&self.db);
        connect::check_pooling(
            &self.pool,
            self.config.prepared_statements,
            self.config.listen,
            listen_through_pool,
            self.config.poll_interval,
        )
        .await
        .map(StartUp::Ready)
    }

    /// The start-up check, repeated while the database cannot be reached
    /// (not started yet, restarting, a network still coming up) and while
    /// its schema waits for `pgwake migrate` (missing, older, or a migrate
    /// running), with capped backoff (`reconnect_min` doubling to
    /// `reconnect_max`; at most
    /// [`SCHEMA_RECHECK_MAX`](crate::config::SCHEMA_RECHECK_MAX) between
    /// schema checks) and a log line saying what it waits for; the worker
    /// reports not ready meanwhile. Anything else (a setting, a schema newer than
    /// this binary, a handler, a refused password) ends the start at once,
    /// as does any failure with `fail_fast`. `None`: `stop` came first.
    async fn wait_for_database(
        &self,
        stop: &CancellationToken,
    ) -> Result<Option<connect::Pooling>> {
        let mut delay = self.config.reconnect_min;
        let mut waited = false;
        // The schema state last logged, and when: a line when it changes,
        // and a reminder every SCHEMA_WAIT_LOG_EVERY while it does not.
        let mut logged: Option<(crate::admin::schema::Pending, tokio::time::Instant)> = None;
        loop {
            let e = match self.start_up_check().await {
                Ok(StartUp::Ready(pooling)) => {
                    self.health.set_schema_pending(None);
                    if waited {
                        tracing::info!("the database answers and its schema is current; starting");
                    }
                    return Ok(Some(pooling));
                }
                Ok(StartUp::SchemaPending(p)) => {
                    if self.config.fail_fast {
                        return Err(Error::Schema(p.to_string()));
                    }
                    self.health.set_db(true);
                    self.health.set_schema_pending(Some(p.to_string()));
                    let due = match logged {
                        Some((q, at)) => q != p || at.elapsed() >= SCHEMA_WAIT_LOG_EVERY,
                        None => true,
                    };
                    if due {
                        tracing::warn!(
                            "waiting for the schema: {p} (not ready until it is current; --fail-fast exits instead)"
                        );
                        logged = Some((p, tokio::time::Instant::now()));
                    }
                    waited = true;
                    delay = delay.min(crate::config::SCHEMA_RECHECK_MAX);
                    tokio::select! {
                        _ = stop.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay = (delay * 2)
                        .min(self.config.reconnect_max)
                        .min(crate::config::SCHEMA_RECHECK_MAX);
                    continue;
                }
                Err(e) => e,
            };
            let unreachable = e.is_connection_lost() || e.is_unreachable();
            if self.config.fail_fast || !unreachable {
                return Err(e);
            }
            self.health.set_db(false);
            tracing::warn!(
                error = %e,
                retry_in = ?delay,
                "waiting for the database (not ready until it answers; --fail-fast exits instead)"
            );
            waited = true;
            tokio::select! {
                _ = stop.cancelled() => return Ok(None),
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.config.reconnect_max);
        }
    }

    /// Say at start when tx-mode batches cannot use every slot: each holds
    /// a claim connection while it runs, and the claim tasks (`tasks`) are
    /// fewer than `--concurrency`. A warning when the default pool's cap
    /// binds (the flags did not ask for it), a note when `--max-connections`
    /// was set.
    fn say_tx_bound(&self, tasks: usize) {
        let slots = self.config.concurrency;
        if !self.tx || tasks >= slots {
            return;
        }
        let lease = if crate::claim::uses(
            &self.config,
            &self.registry,
            crate::handler::Delivery::Lease,
        ) {
            "; lease-mode jobs still use every slot"
        } else {
            ""
        };
        // The way out for jobs that never write through the claim
        // transaction: lease mode holds no connection while they run.
        let lease = format!(
            "{lease}; jobs that never write through the claim transaction need no connection while they run: deliver them in lease mode (a Rust handler's Handler::delivery returning Delivery::Lease, or --lease-queues Q)"
        );
        match self.config.max_connections {
            None => tracing::warn!(
                "tx mode: at most {tasks} batches run at once, not --concurrency {slots}: each running tx batch holds a claim connection, and the claim pool opens at most {} by default ({tasks} for claims, {} for the services); set --max-connections {} to run {slots} at once (the server's max_connections must allow it){lease}",
                crate::config::MAX_CONNECTIONS_TX_DEFAULT,
                crate::config::SERVICE_CONNECTIONS,
                slots + crate::config::SERVICE_CONNECTIONS,
            ),
            Some(n) => tracing::info!(
                "tx mode: at most {tasks} batches run at once, below --concurrency {slots}: each running tx batch holds a claim connection, and --max-connections {n} leaves {tasks} for claims{lease}"
            ),
        }
    }

    /// Run one claim round in the calling task, on the worker's own pools:
    /// claim (in each delivery mode this worker has) and run up to a batch,
    /// write the outcomes, and return how many jobs were claimed. Dropping
    /// the future at any point loses no job and leaves no pooled connection
    /// in a transaction. For tests and tools; `run` is the service.
    pub async fn claim_once(&self) -> Result<usize> {
        crate::claim::claim_once(self.setup()).await
    }

    /// The claim pool (for embedding applications and tests).
    pub fn pool(&self) -> &deadpool_postgres::Pool {
        &self.pool
    }

    /// Every queue this worker claims from (`None`: all).
    fn worked_queues(&self) -> Option<Vec<String>> {
        self.config.queues.as_ref().map(|q| {
            let mut all = q.clone();
            for l in self
                .config
                .lease_queues
                .iter()
                .chain(&self.config.tx_queues)
            {
                if !all.contains(l) {
                    all.push(l.clone());
                }
            }
            all
        })
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
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // or truncates.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0 {
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "unknown".into()
    }
}

fn worker_id() -> String {
    format!(
        "{}:{}:{:08x}",
        hostname(),
        std::process::id(),
        rand::random::<u32>()
    )
}
