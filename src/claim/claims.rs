//! The claim path's one entry point for the worker ([`Claims`]): it builds
//! the claim context, starts the claim tasks and the lease-mode services
//! (completer, heartbeat, the prefetch buffer's keepers, the progress
//! writer), hands the worker's services what they share with the claim
//! path (wake-ups, the due-time schedule, the cancel book, the slots), and
//! stops it all in order at shutdown. Also one claim round for tests and
//! tools ([`claim_once`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::claim::choose::idle::WaitState;
use crate::claim::choose::next_due::Schedule;
use crate::claim::choose::state::ChoiceState;
use crate::claim::choose::wake::{Trigger, Wakeup};
use crate::claim::context::{ClaimContext, JobEvent};
use crate::claim::lease::state::LeaseState;
use crate::claim::outcome::results::Switch;
use crate::claim::outcome::tally::Tally;
use crate::claim::outcome::Finished;
use crate::claim::run::cancels::CancelBook;
use crate::claim::tx::state::TxState;
use crate::config::WorkerConfig;
use crate::error::Result;
use crate::handler::{Delivery, Registry};
use crate::health::Health;

/// What the worker keeps for the claim path from its build on, before it
/// runs: its services and start-up check read and set these too.
#[derive(Default)]
pub(crate) struct Shared {
    /// Idle/draining state of the claim tasks, for the waiting
    /// registration.
    pub wait_state: Arc<WaitState>,
    /// Whether finished jobs are recorded (the database's setting).
    pub history: Arc<Switch>,
    /// The per-minute rollup's counts (used when `config.rollup` is set).
    pub rollup: Arc<Tally>,
}

/// What the claim path is built from: the worker's settings and
/// connections.
pub(crate) struct Setup<'w> {
    pub config: &'w WorkerConfig,
    pub registry: &'w Registry,
    pub pool: &'w deadpool_postgres::Pool,
    /// Durable writes outside any claim transaction: rate admissions (both
    /// modes), tx-mode batch marks and crash charges.
    pub ledger_pool: &'w deadpool_postgres::Pool,
    pub health: &'w Arc<Health>,
    pub events: &'w broadcast::Sender<JobEvent>,
    pub worker_id: &'w str,
    pub shared: &'w Shared,
    /// Whether the worker has tx-mode claims (`WorkerConfig::connections`).
    pub tx: bool,
}

/// Whether any claim of a worker so configured is in `mode`.
pub(crate) fn uses(config: &WorkerConfig, registry: &Registry, mode: Delivery) -> bool {
    crate::claim::choose::plan::build(config, registry)
        .iter()
        .any(|s| s.mode == mode)
}

/// The delivery modes a worker so configured claims in, for its start-up
/// log line.
pub(crate) fn describe_modes(config: &WorkerConfig, registry: &Registry) -> String {
    crate::claim::choose::plan::describe(config, registry)
}

/// The claim context of `setup`, and where its lease-mode runs send their
/// outcomes.
fn context(
    setup: &Setup<'_>,
    cancels: Arc<CancelBook>,
    wake: Arc<Wakeup>,
    schedule: Arc<Schedule>,
    stop: CancellationToken,
    abort: CancellationToken,
) -> (ClaimContext, mpsc::UnboundedReceiver<Finished>) {
    let (completer, completions) = crate::claim::lease::book::channel();
    let config = setup.config;
    let plan = crate::claim::choose::plan::build(config, setup.registry);
    let ctx = ClaimContext {
        config: config.clone(),
        pool: setup.pool.clone(),
        ledger_pool: setup.ledger_pool.clone(),
        registry: setup.registry.clone(),
        wake,
        schedule,
        health: setup.health.clone(),
        events: setup.events.clone(),
        stop,
        abort,
        worker_id: setup.worker_id.to_string(),
        slots: Arc::new(Semaphore::new(config.concurrency)),
        history: setup.shared.history.clone(),
        rollup: config.rollup.as_ref().map(|_| setup.shared.rollup.clone()),
        cancels,
        progress: Default::default(),
        lease: LeaseState {
            turn: crate::claim::lease::turn::LeaseTurn::for_worker(
                config.concurrency,
                config.claim_tasks(setup.tx),
                config.batch,
                config.prefetch_jobs() > 0,
                plan.iter().any(|s| s.mode == Delivery::Tx),
            ),
            book: Default::default(),
            prefetch: crate::claim::lease::prefetch::Prefetch::sized(
                crate::claim::lease::prefetch::Size::of(config.prefetch),
            ),
            completer,
            start_marks: crate::claim::lease::starts::StartMarks::spawn(setup.pool.clone()),
            jobs: TaskTracker::new(),
        },
        tx: TxState {
            begin_sql: crate::claim::tx::begin_sql(config),
            marks_durable: Default::default(),
        },
        choice: ChoiceState {
            plan,
            cursor: Default::default(),
            ready_queues: Default::default(),
            key_cursors: Default::default(),
            claim_cursors: Default::default(),
            key_repairs: crate::claim::choose::key_repair::KeyRepairs::new(setup.pool.clone()),
            wait_state: setup.shared.wait_state.clone(),
            overlap: Default::default(),
        },
    };
    (ctx, completions)
}

/// A worker's claim path: built by [`Claims::new`], started by
/// [`Claims::start`], stopped by [`Claims::shut_down`].
///
/// ```text
///   new ── wake(), schedule(), cancels(), slots() ──▶ the worker's services
///    │
///   start: completer, heartbeat, bury_cancelled, hand_back_stalled,
///          progress writer; `tasks` claim tasks (claimer.rs)
///    │
///   shut_down: claim tasks and runs (grace, abort, hard deadline) ──▶
///          hand back the prefetch buffer ──▶ handlers' shutdown ──▶
///          last outcome writes ──▶ lease services
/// ```
pub(crate) struct Claims {
    ctx: Arc<ClaimContext>,
    /// Lease-mode outcomes, until the completer takes them at start.
    completions: Option<mpsc::UnboundedReceiver<Finished>>,
    /// Stops the heartbeat, the prefetch buffer's keepers and the progress
    /// writer, after the last run.
    lease_stop: CancellationToken,
    /// Stops the completer once every outcome is sent.
    completer_done: CancellationToken,
    lease_services: JoinSet<()>,
    claimers: JoinSet<()>,
}

impl Claims {
    /// The claim path of `setup` (nothing runs yet): `stop` ends the
    /// claims, `abort` interrupts running jobs.
    pub(crate) fn new(setup: Setup<'_>, stop: CancellationToken, abort: CancellationToken) -> Self {
        let (ctx, completions) = context(
            &setup,
            Arc::new(CancelBook::default()),
            Arc::new(Wakeup::default()),
            Arc::new(Schedule::default()),
            stop,
            abort,
        );
        Claims {
            ctx: Arc::new(ctx),
            completions: Some(completions),
            lease_stop: CancellationToken::new(),
            completer_done: CancellationToken::new(),
            lease_services: JoinSet::new(),
            claimers: JoinSet::new(),
        }
    }

    /// The wake-ups of the claim tasks (the listener, the waiting
    /// registration and the poller send them).
    pub(crate) fn wake(&self) -> Arc<Wakeup> {
        self.ctx.wake.clone()
    }

    /// Wake every claim task for a poll (poll-only: nobody else wakes them
    /// at start).
    pub(crate) fn wake_all(&self) {
        self.ctx.wake.wake_all(Trigger::Poll);
    }

    /// The next due time of retried and snoozed jobs (the poller reads it).
    pub(crate) fn schedule(&self) -> Arc<Schedule> {
        self.ctx.schedule.clone()
    }

    /// The running jobs a cancel request can stop (the listener and the
    /// cancel watcher feed it).
    pub(crate) fn cancels(&self) -> Arc<CancelBook> {
        self.ctx.cancels.clone()
    }

    /// One permit per job that may run at once (the fleet membership
    /// reports the busy ones).
    pub(crate) fn slots(&self) -> Arc<Semaphore> {
        self.ctx.slots.clone()
    }

    /// The delivery modes of the claim plan, for the metrics' known labels.
    pub(crate) fn modes(&self) -> Vec<&'static str> {
        self.ctx
            .choice
            .plan
            .iter()
            .map(|s| s.mode.as_str())
            .collect()
    }

    /// The prefetch setting in force, for the start-up log line.
    pub(crate) fn describe_prefetch(&self) -> String {
        crate::claim::lease::prefetch::Size::of(self.ctx.config.prefetch).describe(
            self.ctx
                .choice
                .plan
                .iter()
                .any(|s| s.mode == crate::handler::Delivery::Lease),
        )
    }

    /// Start the lease-mode services and `tasks` claim tasks. The completer
    /// and the heartbeat outlive the claim tasks and the lease-mode runs:
    /// outcomes are written, and leases kept until then.
    pub(crate) fn start(&mut self, tasks: usize) {
        let ctx = &self.ctx;
        let completions = self.completions.take().expect("started once");
        self.lease_services
            .spawn(crate::claim::lease::completer::run(
                ctx.clone(),
                completions,
                self.completer_done.clone(),
            ));
        self.lease_services.spawn(crate::claim::lease::heartbeat(
            ctx.clone(),
            self.lease_stop.clone(),
        ));
        self.lease_services
            .spawn(crate::claim::lease::bury_cancelled(
                ctx.clone(),
                self.lease_stop.clone(),
            ));
        self.lease_services
            .spawn(crate::claim::lease::hand_back_stalled(
                ctx.clone(),
                self.lease_stop.clone(),
            ));
        // Stopped after the last run: its last flush clears their rows.
        self.lease_services.spawn(crate::claim::run::progress::run(
            ctx.progress.clone(),
            ctx.pool.clone(),
            ctx.config.prepared_statements,
            ctx.config.progress_interval,
            self.lease_stop.clone(),
        ));
        for _ in 0..tasks {
            self.claimers
                .spawn(crate::claim::claimer::run_task(ctx.clone()));
        }
    }

    /// Shutdown, once `stop` is cancelled: running jobs get `grace`; then
    /// (or at once on `abort`) they are interrupted and handed back, and
    /// after `hard_deadline` more the claim tasks are left to the server's
    /// rollback and the lease rescuer. Then the handlers' shutdown, the
    /// last outcome writes and the lease services. The claim context lives
    /// on until `self` is dropped.
    pub(crate) async fn shut_down(&mut self, grace: Duration, hard_deadline: Duration) {
        self.stop_runs(grace, hard_deadline).await;
        // Claim tasks aborted at the hard deadline may have buffered more.
        crate::claim::lease::hand_back(&self.ctx);
        // What handlers keep running (persistent processes) stops now that
        // no job needs it.
        let registry = &self.ctx.registry;
        let handlers: Vec<_> = registry
            .named()
            .map(|(_, h)| h.clone())
            .chain(registry.catch_all().cloned())
            .collect();
        futures::future::join_all(handlers.iter().map(|h| h.shutdown())).await;
        self.completer_done.cancel();
        self.lease_stop.cancel();
        join_all(&mut self.lease_services).await;
    }

    /// Wait for the claim tasks and the running jobs: `grace`, then
    /// interrupt them and wait `hard_deadline` more.
    async fn stop_runs(&mut self, grace: Duration, hard_deadline: Duration) {
        let Claims { ctx, claimers, .. } = self;
        let ctx: &ClaimContext = ctx;
        ctx.lease.jobs.close();
        let running = async {
            join_all(&mut *claimers).await;
            // No claim is in flight now: what waits in the prefetch buffer
            // never started, and goes back at once, attempts refunded.
            crate::claim::lease::hand_back(ctx);
            ctx.lease.jobs.wait().await;
        };
        let drained = tokio::select! {
            _ = running => true,
            _ = tokio::time::sleep(grace) => false,
            _ = ctx.abort.cancelled() => false,
        };
        if !drained {
            tracing::warn!("grace period over: interrupting running jobs and handing them back");
            ctx.abort.cancel();
            let running = async {
                join_all(&mut *claimers).await;
                crate::claim::lease::hand_back(ctx);
                ctx.lease.jobs.wait().await;
            };
            if tokio::time::timeout(hard_deadline, running).await.is_err() {
                tracing::error!("jobs did not stop within the hard deadline; leaving them to the server's rollback and the lease rescuer");
                claimers.abort_all();
            }
        }
    }
}

/// Run one claim round in the calling task, on `setup`'s pools: claim (in
/// each delivery mode the plan has) and run up to a batch, write the
/// outcomes, and return how many jobs were claimed. Dropping the future at
/// any point loses no job and leaves no pooled connection in a transaction.
pub(crate) async fn claim_once(setup: Setup<'_>) -> Result<usize> {
    let (mut ctx, completions) = context(
        &setup,
        Default::default(),
        Arc::new(Wakeup::default()),
        Arc::new(Schedule::default()),
        CancellationToken::new(),
        CancellationToken::new(),
    );
    // One round runs what it claimed and no more.
    ctx.lease.prefetch = crate::claim::lease::prefetch::Prefetch::new(0);
    let ctx = Arc::new(ctx);
    let done = CancellationToken::new();
    let completer = tokio::spawn(crate::claim::lease::completer::run(
        ctx.clone(),
        completions,
        done.clone(),
    ));
    let heartbeat = tokio::spawn(crate::claim::lease::heartbeat(ctx.clone(), done.clone()));
    let permit = ctx
        .slots
        .clone()
        .acquire_owned()
        .await
        .expect("fresh semaphore");
    // One full batch, as configured (the service sizes batches by time).
    let mut sizer = crate::claim::tx::BatchSizer::at(setup.config.batch);
    let claimed = crate::claim::claimer::claim_round(&ctx, Trigger::Poll, Some(permit), &mut sizer)
        .await
        .map(|r| r.claimed);
    ctx.lease.jobs.close();
    ctx.lease.jobs.wait().await;
    // What the round's runs reported, and their clears.
    if let Err(e) = ctx
        .progress
        .flush(&ctx.pool, ctx.config.prepared_statements)
        .await
    {
        tracing::warn!(error = %e, "writing progress failed");
    }
    done.cancel();
    let _ = completer.await;
    let _ = heartbeat.await;
    claimed
}

/// Join every task of `set`, logging those that panicked.
async fn join_all(set: &mut JoinSet<()>) {
    while let Some(r) = set.join_next().await {
        if let Err(e) = r {
            if e.is_panic() {
                tracing::error!(error = %e, "a worker task panicked");
            }
        }
    }
}
