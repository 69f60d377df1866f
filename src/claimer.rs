//! Claim tasks: the pool of `concurrency` tasks that wait for a wake-up,
//! claim a batch, run it (through [`crate::txmode`]) and drain until the
//! queue is empty.
//!
//! ```text
//!            ┌──────── wake (notify | poll | drain | reconnect) ◀─────┐
//!            ▼                                                        │
//!   idle ──▶ claim ≤ batch ──empty──▶ idle                            │
//!              │ hit (full batch → wake one more task: drain) ────────┘
//!              ▼
//!            run jobs one by one ──▶ write outcomes ──▶ commit ──▶ claim again
//! ```
//!
//! Database errors never end a task: it backs off (capped, jittered) and
//! tries again, and the worker reports not-ready meanwhile.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::config::WorkerConfig;
use crate::handler::Registry;
use crate::health::Health;
use crate::job::Resolution;
use crate::poller::Schedule;
use crate::wake::{Trigger, Wakeup};

/// What became of one job; sent to [`crate::Worker::subscribe`]rs after the
/// outcome is committed.
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
    /// The failure reason, for retries and dead jobs.
    pub error: Option<String>,
}

/// State shared by a worker's claim tasks.
pub(crate) struct Shared {
    pub config: WorkerConfig,
    pub pool: deadpool_postgres::Pool,
    /// Pool for the crash-attempt ledger (`synchronous_commit = off`).
    pub attempts_pool: deadpool_postgres::Pool,
    pub registry: Registry,
    pub wake: Arc<Wakeup>,
    pub schedule: Arc<Schedule>,
    pub health: Arc<Health>,
    pub events: broadcast::Sender<JobEvent>,
    /// Cancelled at shutdown: claim nothing more, start no more jobs.
    pub stop: CancellationToken,
    /// Cancelled when the grace period is over: interrupt running jobs.
    pub abort: CancellationToken,
    /// `BEGIN` plus the claim transaction's `SET LOCAL`s.
    pub begin_sql: String,
    /// Queues claimed in tx mode (`None`: all but the lease queues).
    pub tx_queues: Option<Vec<String>>,
    /// Queues claimed in lease mode.
    pub lease_queues: Vec<String>,
    /// This worker's id in `leased_jobs.worker_id`.
    pub worker_id: String,
    /// Rotates the order in which a worker's queues are claimed.
    pub queue_cursor: std::sync::atomic::AtomicUsize,
    /// Idle/draining state for the waiting registration.
    pub wait_state: Arc<crate::waiting::WaitState>,
}

/// Which delivery mode a claim round tries first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Tx,
    Lease,
}

/// One claim: in each mode this worker has, starting with `first` (the
/// modes alternate between rounds so neither starves the other), until one
/// finds jobs. Returns how many were claimed.
async fn claim_round(shared: &Shared, trigger: Trigger, first: Mode) -> crate::Result<usize> {
    let order = match first {
        Mode::Tx => [Mode::Tx, Mode::Lease],
        Mode::Lease => [Mode::Lease, Mode::Tx],
    };
    for mode in order {
        let claimed = match mode {
            Mode::Tx if shared.tx_queues.as_ref().is_none_or(|q| !q.is_empty()) => {
                crate::txmode::claim_and_run(shared, trigger).await?
            }
            Mode::Lease if !shared.lease_queues.is_empty() => {
                crate::leasemode::claim_and_run(shared, trigger).await?
            }
            _ => 0,
        };
        if claimed > 0 {
            return Ok(claimed);
        }
    }
    Ok(0)
}

/// One claim round, tx mode first (see [`crate::Worker::claim_once`]).
pub(crate) async fn claim_round_once(shared: &Shared) -> crate::Result<usize> {
    claim_round(shared, Trigger::Poll, Mode::Tx).await
}

/// One claim task: wait, claim, run, drain; until `stop`.
pub(crate) async fn run_task(shared: Arc<Shared>) {
    let mut first = Mode::Tx;
    loop {
        shared.wait_state.enter_idle();
        let woke = tokio::select! {
            biased;
            _ = shared.stop.cancelled() => None,
            t = shared.wake.wait() => Some(t),
        };
        shared.wait_state.leave_idle();
        let Some(mut trigger) = woke else { return };
        let mut backoff = shared.config.reconnect_backoff();
        loop {
            if shared.stop.is_cancelled() {
                return;
            }
            // A bug in a claim round must not take the task down with it:
            // the round's claim transaction rolls back (its jobs return), and
            // the task carries on.
            let round = AssertUnwindSafe(claim_round(&shared, trigger, first))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    tracing::error!(panic = ?panic.downcast_ref::<&str>().copied().or(panic.downcast_ref::<String>().map(|s| s.as_str())), "claim round panicked; its jobs return to the queue");
                    Err(crate::Error::Config("claim round panicked".into()))
                });
            first = if first == Mode::Tx {
                Mode::Lease
            } else {
                Mode::Tx
            };
            match round {
                Ok(claimed) => {
                    shared.health.set_db(true);
                    if claimed == 0 {
                        break;
                    }
                    shared.wait_state.hit();
                    backoff = shared.config.reconnect_backoff();
                    trigger = Trigger::Drain;
                }
                Err(e) => {
                    if e.is_transient() {
                        shared.health.set_db(false);
                    }
                    let delay = backoff.next().unwrap_or(shared.config.reconnect_max);
                    tracing::warn!(error = %e, retry_in = ?delay, "claim failed");
                    tokio::select! {
                        _ = shared.stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    trigger = Trigger::Poll;
                }
            }
        }
    }
}
