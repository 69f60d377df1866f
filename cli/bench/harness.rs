//! A real [`Worker`] in this process, with a no-op handler, and what the
//! bench observes of it:
//!
//! - handler starts, when asked for: a [`Start`] per job (its instant, and
//!   how late it is against an intended time in its payload);
//! - committed outcomes: counted from [`Worker::subscribe`], where a lagging
//!   receiver is told how many events it missed, so the count stays exact
//!   (every event is sent after its job's commit).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pgwake::connect::DbConfig as Config;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::database::TASK;
use super::mode::Mode;
use pgwake::error::{Error, Result};
use pgwake::{
    async_trait, BoxError, Handler, Job, JobContext, JobEvent, Outcome, Worker, WorkerConfig,
};

/// `application_name` prefix of the worker's connections.
pub(crate) const WORKER_APP: &str = "pgwake-bench-worker";
/// Payload key of a job's intended start time (Unix seconds); see
/// `cli/bench/sql/offer.sql`.
const INTENDED: &str = "t";
/// How long a started worker is left alone before a measurement: its
/// listener's connect wakes every claim task once, those empty claims
/// should be over, and the idle worker registered as waiting.
const SETTLE: Duration = Duration::from_millis(200);
/// How long a worker may take to connect and listen.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a stopping worker may take to return.
const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// One handler start.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    /// The job.
    pub id: i64,
    /// When the handler started.
    pub at: Instant,
    /// Seconds after the job's intended start time, when its payload has one.
    pub late_s: Option<f64>,
}

/// What the no-op handler reports: nothing (the default), or every start.
#[derive(Clone, Default)]
pub(crate) struct Probe {
    starts: Option<mpsc::UnboundedSender<Start>>,
}

impl Probe {
    /// A probe that also reports every start on the returned channel.
    pub fn reporting() -> (Probe, mpsc::UnboundedReceiver<Start>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Probe { starts: Some(tx) }, rx)
    }
}

struct Noop(Probe, pgwake::Delivery);

/// A no-op that declares it writes through the claim transaction: it asks
/// for it (which takes its savepoint) and sends nothing.
struct NoopInTx;

#[async_trait]
impl Handler for NoopInTx {
    async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        ctx.transaction().await?;
        Ok(Outcome::Done)
    }
}

/// The SQL function the `sql` handler kind calls (it does nothing).
pub(crate) const SQL_NOOP: &str =
    "CREATE OR REPLACE FUNCTION pgwake_bench_noop(p jsonb) RETURNS void LANGUAGE sql AS $$ $$";

/// Which handler the bench's worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandlerKind {
    /// A Rust no-op in its default mode (tx), never touching the claim
    /// transaction.
    Noop,
    /// A Rust no-op that asks for the claim transaction.
    NoopInTx,
    /// `--handler noop=sql:pgwake_bench_noop` (see [`SQL_NOOP`]).
    Sql,
    /// `--handler noop=exec:true`.
    ExecTrue,
    /// A `python3` per job that reads its stdin and exits 0
    /// ([`super::persistent::Commands::exec_flag`]).
    ExecPython,
    /// The reference persistent worker in Python, task `echo`, with
    /// `pgwake run`'s default of one process per claim task.
    Persistent,
}

impl HandlerKind {
    /// The task of the jobs this handler serves.
    pub(crate) fn task(self) -> &'static str {
        match self {
            HandlerKind::Persistent => super::persistent::TASK,
            _ => TASK,
        }
    }
}

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let at = Instant::now();
        if let Some(starts) = &self.0.starts {
            let late_s = job
                .payload
                .get(INTENDED)
                .and_then(|t| t.as_f64())
                .map(|t| unix_now() - t);
            // The receiver going away only means nobody is measuring any more.
            let _ = starts.send(Start {
                id: job.id,
                at,
                late_s,
            });
        }
        Ok(Outcome::Done)
    }

    fn delivery(&self) -> pgwake::Delivery {
        self.1
    }
}

/// Seconds since the Unix epoch, as a float (the producers' clock too).
pub(crate) fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// How the bench's worker is set up.
#[derive(Debug, Clone)]
pub(crate) struct WorkerSpec {
    /// Delivery mode.
    pub mode: Mode,
    /// Claim tasks.
    pub concurrency: usize,
    /// Jobs per claim.
    pub batch: usize,
    /// Lease prefetch buffer (`None`: the worker's default).
    pub prefetch: Option<usize>,
    /// Queues to work (`None`: all).
    pub queues: Option<Vec<String>>,
    /// The handler.
    pub handler: HandlerKind,
    /// The per-minute rollup on (the worker's default) or off.
    pub rollup: bool,
}

impl WorkerSpec {
    fn config(&self) -> WorkerConfig {
        self.mode.worker_config(WorkerConfig {
            concurrency: self.concurrency,
            batch: self.batch,
            prefetch: self.prefetch,
            queues: self.queues.clone(),
            application_name: WORKER_APP.into(),
            sample_interval: None,
            grace_period: Duration::from_secs(10),
            rollup: self.rollup.then(pgwake::config::RollupConfig::default),
            ..WorkerConfig::default()
        })
    }
}

/// A worker running on a background task.
pub(crate) struct RunningWorker {
    stop: CancellationToken,
    join: JoinHandle<Result<()>>,
    committed: watch::Receiver<u64>,
}

impl RunningWorker {
    /// Start a worker and wait until it listens and has settled.
    pub async fn start(db: &Config, spec: &WorkerSpec, probe: Probe) -> Result<RunningWorker> {
        let builder = Worker::builder(db.clone()).config(spec.config());
        let builder = match spec.handler {
            HandlerKind::Noop => builder.handler(TASK, Noop(probe, pgwake::Delivery::Tx)),
            HandlerKind::NoopInTx => builder.handler(TASK, NoopInTx),
            HandlerKind::Sql => builder.handler_arc(
                TASK,
                pgwake::handlers::parse_flag("noop=sql:pgwake_bench_noop")?.1,
            ),
            HandlerKind::ExecTrue => {
                builder.handler_arc(TASK, pgwake::handlers::parse_flag("noop=exec:true")?.1)
            }
            HandlerKind::ExecPython => {
                let python = super::persistent::commands().map_err(Error::Config)?;
                builder.handler_arc(TASK, pgwake::handlers::parse_flag(&python.exec_flag)?.1)
            }
            HandlerKind::Persistent => {
                let (processes, inflight) = super::persistent::shape(spec.concurrency);
                let command = format!(
                    "{} --inflight {inflight}",
                    super::persistent::commands()
                        .map_err(Error::Config)?
                        .persistent
                );
                let opts = pgwake::handlers::persistent::Options {
                    processes,
                    ..Default::default()
                };
                builder.handler(
                    super::persistent::TASK,
                    pgwake::handlers::persistent::PersistentHandler::new(
                        super::persistent::TASK,
                        &command,
                        &opts,
                    )?,
                )
            }
        };
        let worker = builder.build()?;
        let (count, committed) = watch::channel(0);
        tokio::spawn(count_committed(worker.subscribe(), count));
        let health = worker.health();
        let stop = CancellationToken::new();
        let join = tokio::spawn(worker.run(stop.clone(), CancellationToken::new()));
        let running = RunningWorker {
            stop,
            join,
            committed,
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        while !health.ready() {
            if running.join.is_finished() {
                return Err(running.stop().await.err().unwrap_or_else(|| {
                    super::aborted("the worker returned before it was ready".into())
                }));
            }
            if Instant::now() > deadline {
                running.stop().await?;
                return Err(super::aborted(format!(
                    "the worker was not ready within {READY_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(SETTLE).await;
        Ok(running)
    }

    /// Jobs whose outcome is committed so far.
    pub fn committed(&self) -> u64 {
        *self.committed.borrow()
    }

    /// Wait until `n` outcomes are committed; returns when that was seen.
    pub async fn wait_committed(&self, n: u64, timeout: Duration) -> Result<Instant> {
        let mut rx = self.committed.clone();
        let reached = async { rx.wait_for(|c| *c >= n).await.map(|_| ()) };
        match tokio::time::timeout(timeout, reached).await {
            Ok(Ok(_)) => Ok(Instant::now()),
            Ok(Err(_)) => Err(super::aborted(format!(
                "the worker stopped after committing {} of {n} jobs",
                self.committed()
            ))),
            Err(_) => Err(super::aborted(format!(
                "the worker committed only {} of {n} jobs within {timeout:?}",
                self.committed()
            ))),
        }
    }

    /// Stop the worker gracefully and return what it returned.
    pub async fn stop(self) -> Result<()> {
        self.stop.cancel();
        match tokio::time::timeout(STOP_TIMEOUT, self.join).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => Err(Error::Io {
                context: "bench: the worker task failed".into(),
                source: std::io::Error::other(e),
            }),
            Err(_) => Err(super::aborted(format!(
                "the worker did not stop within {STOP_TIMEOUT:?}"
            ))),
        }
    }
}

/// Count committed outcomes, missed (lagged) events included.
async fn count_committed(mut events: broadcast::Receiver<JobEvent>, count: watch::Sender<u64>) {
    let mut n = 0u64;
    loop {
        match events.recv().await {
            Ok(_) => n += 1,
            Err(broadcast::error::RecvError::Lagged(missed)) => n += missed,
            Err(broadcast::error::RecvError::Closed) => return,
        }
        count.send_replace(n);
    }
}

/// A drain timeout generous enough for any sane rate: two minutes plus
/// 2 ms per job.
pub(crate) fn drain_timeout(jobs: u64) -> Duration {
    Duration::from_secs(120)
        + Duration::from_millis(2).saturating_mul(u32::try_from(jobs).unwrap_or(u32::MAX))
}
