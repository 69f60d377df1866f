//! The claim context: what every part of the claim path reads (config,
//! pools, handlers, wake-ups, slots, cancels) and the parts each owns,
//! defined where their code lives ([`ChoiceState`] in `choose/`,
//! [`LeaseState`] in `lease/`, [`TxState`] in `tx/`); and the steps both
//! delivery modes take the same way: the checks before a job runs (the
//! resolution itself is chosen in `outcome/resolve.rs`) and reporting an
//! outcome.
//!
//! ```text
//!   claimer.rs ── claim ──▶ tx/ | lease/ ── run ──▶ run/executor.rs
//!        ▲                        │                                   │
//!        └──── slots ◀────────────┴──── record (tx: commit | lease: lease/completer.rs)
//!                                                   │
//!                                          report() here: metrics, events, the rollup tally
//! ```
//!
//! Built by `claims.rs`; used by `claimer.rs` and the modes, which hand
//! `choose/` the pieces it needs ([`ClaimContext::ledger`],
//! [`ClaimContext::walk`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::{broadcast, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::claim::choose::next_due::Schedule;
use crate::claim::choose::plan::{ClaimSpec, Targets};
use crate::claim::choose::state::ChoiceState;
use crate::claim::choose::wake::Wakeup;
use crate::claim::lease::state::LeaseState;
use crate::claim::run::claimed::Claimed;
use crate::claim::run::executor::Ended;
use crate::claim::tx::state::TxState;
use crate::config::WorkerConfig;
use crate::handler::{Handler, Registry};
use crate::health::Health;
use crate::job::{Job, Resolution};
use crate::metrics;

/// What became of one job; sent to [`crate::Worker::subscribe`]rs after the
/// outcome is committed.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub struct JobEvent {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its task.
    pub task: String,
    /// The attempt that ended (1-based).
    pub attempt: i32,
    /// What happened.
    pub resolution: Resolution,
}

impl JobEvent {
    /// The `outcome` label: `done`, `retry`, `snoozed`, `sleeping`,
    /// `waiting_for_signal`, `dead`, `returned`, `lost` or `cancelled`
    /// ([`Resolution::label`](crate::Resolution::label)).
    pub fn outcome(&self) -> &'static str {
        self.resolution.label()
    }

    /// The failure reason, for retries and dead jobs.
    pub fn error(&self) -> Option<&str> {
        self.resolution.reason()
    }
}

/// State shared by a worker's claim path: what every part reads, and the
/// parts each owns, defined where their code lives.
pub(crate) struct ClaimContext {
    pub config: WorkerConfig,
    pub pool: deadpool_postgres::Pool,
    /// Durable writes outside any claim transaction: rate admissions (both
    /// modes), tx-mode batch marks and crash charges.
    pub ledger_pool: deadpool_postgres::Pool,
    pub registry: Registry,
    pub wake: Arc<Wakeup>,
    pub schedule: Arc<Schedule>,
    pub health: Arc<Health>,
    pub events: broadcast::Sender<JobEvent>,
    /// Cancelled at shutdown: claim nothing more, start no more jobs.
    pub stop: CancellationToken,
    /// Cancelled when the grace period is over: interrupt running jobs.
    pub abort: CancellationToken,
    /// This worker's id in `leased_jobs.worker_id` and `tx_batches`.
    pub worker_id: String,
    /// One permit per job that may run at once (`concurrency`).
    pub slots: Arc<Semaphore>,
    /// Whether finished jobs are recorded (`crate::admin::history`).
    pub history: Arc<crate::claim::outcome::results::Switch>,
    /// Running jobs a cancel request can stop (`cancels.rs`).
    pub cancels: Arc<crate::claim::run::cancels::CancelBook>,
    /// The per-minute rollup's counts (`services/rollup.rs`); `None` when
    /// the rollup is off.
    pub rollup: Option<Arc<crate::claim::outcome::tally::Tally>>,
    /// What running jobs report of their progress, written every
    /// `progress_interval` (`progress.rs`).
    pub progress: Arc<crate::claim::run::progress::Progress>,
    /// What to claim and where its rotations stand (`choose/`).
    pub choice: ChoiceState,
    /// Lease mode's state (`lease/`).
    pub lease: LeaseState,
    /// Tx mode's state (`tx/`).
    pub tx: TxState,
}

impl ClaimContext {
    /// While claims resume after the last job claimed
    /// (`Health::claims_resume`: the governor's level above ok, or a
    /// transaction open 5 s, at the last sample), the least time between
    /// two reads of the ready queues, and between two claims from the head
    /// of the claim index (cursor.rs).
    pub(crate) fn pressure_throttle(&self) -> Option<std::time::Duration> {
        self.health
            .claims_resume()
            .then_some(self.config.pressure_head_scan_every)
    }

    /// Where admissions are taken and given back (`choose/rate.rs`).
    pub(crate) fn ledger(&self) -> crate::claim::choose::rate::Ledger<'_> {
        crate::claim::choose::rate::Ledger {
            pool: &self.ledger_pool,
            prepared: self.config.prepared_statements,
            schedule: &self.schedule,
        }
    }

    /// A claim round's walk over `targets`, for claims of up to `limit`
    /// jobs of `spec` (`choose/targets.rs`).
    pub(crate) fn walk<'a>(
        &'a self,
        spec: &'a ClaimSpec,
        targets: &'a [crate::claim::choose::plan::Target],
        limit: i64,
    ) -> crate::claim::choose::targets::Walk<'a> {
        crate::claim::choose::targets::Walk::new(
            self.ledger(),
            &self.choice.key_cursors,
            &self.wake,
            spec,
            targets,
            limit,
        )
    }

    /// Where `spec` claims this round (reading the ready queues when stale).
    pub(crate) async fn targets(&self, spec: &ClaimSpec) -> crate::error::Result<Targets> {
        // Listed queues are tried by name: they need the limited queues only.
        let wants_ready = matches!(
            spec.queues,
            crate::claim::choose::plan::Queues::AllExcept(_)
        );
        let (ready, limited) = self
            .choice
            .ready_queues
            .get(
                &self.pool,
                self.config.prepared_statements,
                wants_ready,
                self.pressure_throttle(),
            )
            .await?;
        Ok(spec.targets(&self.choice.cursor, &ready, &limited))
    }

    /// What must happen to a claimed job before any handler runs:
    /// `Ok(handler)` to run it, or the resolution when it must not run
    /// ([`refusal`](crate::claim::outcome::resolve::refusal)).
    pub(crate) fn precheck(&self, c: &Claimed) -> Result<Arc<dyn Handler>, Resolution> {
        let handler = self.registry.get(&c.job.task);
        match crate::claim::outcome::resolve::refusal(c, self.stop.is_cancelled(), handler) {
            Some(resolution) => Err(resolution),
            None => Ok(handler.expect("a job without a handler is refused").clone()),
        }
    }

    /// The timeout of one run of `job`.
    pub(crate) fn timeout_of(&self, job: &Job) -> Duration {
        // A job enqueued before the 24-day bound may say more.
        job.timeout
            .unwrap_or(self.config.job_timeout)
            .min(crate::config::JOB_TIMEOUT_MAX)
    }

    /// The result to record for a run that ended so: in the history while
    /// it is on, and on the job's edges to its children whatever the
    /// history setting (a flow's child reads it). A run that returned no
    /// result costs nothing.
    pub(crate) fn result_of(&self, ended: &Ended) -> Option<String> {
        match ended {
            Ended::Outcome(outcome) => crate::claim::outcome::results::result_of(outcome),
            _ => None,
        }
    }

    /// After the outcome is committed: metrics, logs, events, and the next
    /// due time of retried jobs for the poller.
    pub(crate) fn report(&self, claimed: &Claimed, resolution: Resolution, duration: Duration) {
        let job = &claimed.job;
        // The job's log lines below carry its span's fields (its trace id).
        let _span = claimed.trace.as_ref().map(|t| t.span.enter());
        if let Resolution::Retry { delay, .. }
        | Resolution::Snoozed { delay }
        | Resolution::Sleeping { delay }
        | Resolution::WaitingForSignal { timeout: delay, .. } = &resolution
        {
            self.schedule.hint(SystemTime::now() + *delay);
        }
        let outcome = resolution.label();
        let labels = [
            ("queue", metrics::queue_label(&job.queue)),
            ("task", metrics::task_label(&job.task)),
            ("outcome", outcome.to_string()),
        ];
        ::metrics::counter!(metrics::JOBS, &labels).increment(1);
        ::metrics::histogram!(metrics::JOB_DURATION, &labels).record(duration.as_secs_f64());
        // The per-minute rollup counts the runs that ended the job or its
        // attempt; a returned or lost run is not an outcome.
        if let (Some(tally), true) = (
            &self.rollup,
            matches!(
                resolution,
                Resolution::Done
                    | Resolution::Retry { .. }
                    | Resolution::Dead { .. }
                    | Resolution::Cancelled
            ),
        ) {
            tally.count(&job.queue, &job.task, outcome, claimed.ready_for);
        }
        if self.history.on() {
            match &resolution {
                Resolution::Done => crate::claim::outcome::results::count_recorded("done", 1),
                Resolution::Dead { .. } => {
                    crate::claim::outcome::results::count_recorded("dead", 1)
                }
                _ => {}
            }
        }
        let error = resolution.reason().unwrap_or("");
        match &resolution {
            Resolution::Dead { .. } => {
                tracing::warn!(job = job.id, task = %job.task, attempt = job.attempt, error, "job dead")
            }
            Resolution::Retry { .. } => {
                tracing::info!(job = job.id, task = %job.task, attempt = job.attempt, error, "job failed, will retry")
            }
            Resolution::Snoozed { delay } => {
                tracing::debug!(job = job.id, task = %job.task, attempt = job.attempt, ?delay, "job snoozed, no attempt used")
            }
            Resolution::Sleeping { delay } => {
                tracing::debug!(job = job.id, task = %job.task, attempt = job.attempt, ?delay, "job sleeping, no attempt used")
            }
            Resolution::WaitingForSignal { key, timeout } => {
                tracing::debug!(job = job.id, task = %job.task, attempt = job.attempt, ?key, ?timeout, "job waiting for a signal, no attempt used")
            }
            Resolution::Lost => {
                tracing::warn!(job = job.id, task = %job.task, attempt = job.attempt, "lease lost: this run's outcome was not recorded; the job runs again")
            }
            Resolution::Cancelled => {
                ::metrics::counter!(metrics::JOBS_CANCELLED, "queue" => metrics::queue_label(&job.queue))
                    .increment(1);
                tracing::info!(job = job.id, task = %job.task, attempt = job.attempt, "job cancelled: stopped and moved to dead_jobs")
            }
            _ => tracing::debug!(job = job.id, task = %job.task, outcome, "job resolved"),
        }
        // After the log lines, which need not repeat the outcome and error
        // the span then records.
        crate::claim::run::trace::ended(claimed, &resolution);
        let _ = self.events.send(JobEvent {
            id: job.id,
            queue: job.queue.clone(),
            task: job.task.clone(),
            attempt: job.attempt,
            resolution,
        });
    }
}
