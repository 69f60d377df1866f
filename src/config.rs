//! Worker configuration: every setting with its unit and default, and
//! [`WorkerConfig::validate`], which names the bad setting and the fix.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use crate::error::{Error, Result};

/// How the worker's claim path sends its statements
/// ([`WorkerConfig::prepared_statements`]; `--prepared-statements`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreparedStatements {
    /// Choose at start: [`Unnamed`](PreparedStatements::Unnamed) when the
    /// start-up check finds a transaction-mode pooler in front of the claims
    /// (and says so in the log), [`Cached`](PreparedStatements::Cached)
    /// otherwise. Until [`Worker::run`](crate::Worker::run) has chosen (e.g.
    /// in [`Worker::claim_once`](crate::Worker::claim_once)) it acts as
    /// `Cached`.
    #[default]
    Auto,
    /// Prepare each statement once per pooled connection, as a named
    /// statement, and reuse it (one plan per connection): the fastest, for
    /// connections straight to the server or through session pooling. A
    /// transaction-mode pooler found at start is refused (exit 2).
    Cached,
    /// Never create a named prepared statement: every statement is sent as
    /// the unnamed statement (Parse, Bind, Execute in one round trip, planned
    /// each time). For transaction-mode poolers (PgBouncer 1.18
    /// `pool_mode=transaction`), which cannot carry a named statement from one
    /// transaction to the next.
    Unnamed,
}

impl PreparedStatements {
    /// The flag's spelling: `auto`, `cached` or `unnamed`.
    pub fn as_str(self) -> &'static str {
        match self {
            PreparedStatements::Auto => "auto",
            PreparedStatements::Cached => "cached",
            PreparedStatements::Unnamed => "unnamed",
        }
    }
}

impl std::fmt::Display for PreparedStatements {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PreparedStatements {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(PreparedStatements::Auto),
            "cached" => Ok(PreparedStatements::Cached),
            "unnamed" => Ok(PreparedStatements::Unnamed),
            _ => Err(format!(
                "{s:?} is not a prepared-statement mode: use `auto` (the default: `unnamed` when a transaction-mode pooler is found at start, else `cached`), `cached` (direct or session pooling) or `unnamed` (transaction pooling)"
            )),
        }
    }
}

/// Default [`PreparedStatements`]: auto.
pub const PREPARED_STATEMENTS_DEFAULT: PreparedStatements = PreparedStatements::Auto;

/// Queue of a job enqueued without one (the `pgwake.jobs` column default).
pub const QUEUE_DEFAULT: &str = "default";
/// Priority of a job enqueued without one; lower runs first (the column
/// default).
pub const PRIORITY_DEFAULT: i32 = 0;
/// Attempts a job gets before it moves to `pgwake.dead_jobs`, unless it was
/// enqueued with its own (the column default).
pub const MAX_ATTEMPTS_DEFAULT: i32 = 25;

/// Default `application_name` of the worker's connections.
pub const APPLICATION_NAME_DEFAULT: &str = "pgwake";
/// Default address of the `/metrics`, `/health` and `/ready` endpoint:
/// loopback, so exposing it is a deliberate choice.
pub const METRICS_ADDR_DEFAULT: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 9187));
/// Default job slots: jobs that may run at once (a tx batch takes one).
pub const CONCURRENCY_DEFAULT: usize = 8;
/// Connections a lease-only worker's claim pool opens at most by default:
/// one per slot plus [`SERVICE_CONNECTIONS`], capped at this. In lease mode
/// no running job holds a connection, so a worker of hundreds of slots
/// shares these between its claims, heartbeats and outcome writes. Tuned
/// from measurements (issue 22). A worker with tx-mode claims has its own
/// cap, [`MAX_CONNECTIONS_TX_DEFAULT`].
pub const MAX_CONNECTIONS_DEFAULT: usize = 10;
/// Connections the claim pool of a worker with tx-mode claims opens at most
/// by default: one per slot plus [`SERVICE_CONNECTIONS`], capped at this.
/// A running tx batch holds its claim connection, so the pool must grow
/// with `--concurrency` for the slots to run at once (with the lease cap
/// of 10, `--concurrency 64` ran 8 batches: issue 33, item 16); the cap
/// keeps one worker at most 64 tx batches (and 69 connections in all) of a
/// server whose default `max_connections` is 100. Above it the worker says
/// so at start and `--max-connections` raises it.
pub const MAX_CONNECTIONS_TX_DEFAULT: usize = 66;
/// Connections of the claim pool kept beside the claim tasks, for the
/// services (lease heartbeats and outcome writes, the rescuer, the sampler,
/// cancel checks, recurring jobs): claim tasks are `--max-connections`
/// less these (at least one).
pub const SERVICE_CONNECTIONS: usize = 2;
/// How often, under database pressure, a tx-mode claim over every queue
/// starts at the head of the claim index rather than after the last job
/// claimed ([`WorkerConfig::pressure_head_scan_every`]): at most this long
/// before a job that sorts behind the cursor (committed late, released by
/// its ordering key, rescued, of a higher priority) is seen, unless the
/// last claim from the head took more than a fiftieth of it (the next then
/// comes 50 times that duration later).
pub const PRESSURE_HEAD_SCAN_EVERY_DEFAULT: Duration = Duration::from_secs(1);
/// How many jobs a worker may claim while a transaction is open before its
/// claims resume after the last job claimed, once the transaction is 1 s
/// old ([`WorkerConfig::horizon_held_claims`]).
pub const HORIZON_HELD_CLAIMS_DEFAULT: u64 = 500;
/// How far apart tx-mode claims start once one found jobs but fewer than
/// it asked for ([`WorkerConfig::claim_pace`]).
pub const CLAIM_PACE_DEFAULT: Duration = Duration::from_millis(5);
/// The longest [`WorkerConfig::claim_pace`] accepted.
pub const CLAIM_PACE_MAX: Duration = Duration::from_secs(1);
/// Most lease-mode jobs buffered ahead of the free slots by default. The
/// default buffer holds the jobs this worker starts in 50 ms at its
/// measured rate (at least one, at most this): no-op jobs fill it; slow
/// jobs keep it at a job or two, so a `kill -9` leaves few jobs to refund
/// and other workers are not kept waiting. The cap binds only above 20,000
/// starts/s. Chosen from `pgwake bench` runs of the lease no-op
/// (docs/src/performance.md, "Lease prefetch sized by rate" and "Lease
/// claims that keep up"): at 8 slots it ran 4,434 jobs/s with a fixed
/// buffer of 32, 23,751–26,601 with 200, and with 1,000 (claims of a third
/// of it, two in flight) 41,984–49,601, where 200 ran 26,641–30,062 on
/// the same machine.
pub const PREFETCH_CAP_DEFAULT: usize = 1000;
/// How long a prefetch buffer waits while no job starts before it goes back
/// (`--prefetch-wait`). The default buffer holds about 50 ms of starts;
/// when none has come for 20 times that, every slot is running long jobs
/// and the buffered ones are better off with an idle worker. Handing them
/// back costs one statement per stall.
pub const PREFETCH_WAIT_DEFAULT: Duration = Duration::from_secs(1);
/// Largest `--prefetch`.
pub const PREFETCH_MAX: usize = 1000;
/// Fewest connections a claim pool may have: one for claims, one for the
/// services.
pub const MAX_CONNECTIONS_MIN: usize = 2;
/// Default jobs per claim. 100: tx batches are sized by time below it (they
/// start at one job and double while a batch runs under 100 ms), so only
/// fast jobs reach it; measured with `pgwake bench` (docs/src/performance.md,
/// "Defaults"), a Rust no-op in tx mode ran 5,344 jobs/s at 10 and
/// 19,918–31,410 at 100 (the raw claim loop at 100: about 30,000).
pub const BATCH_DEFAULT: usize = 100;
/// Default fallback poll interval. 2 s: a missed notification (listener
/// reconnecting) or a newly scheduled job costs at most ~2.5 s, while an idle
/// worker runs one cheap indexed query every 2 s.
pub const POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(2);
/// Default per-job timeout.
pub const JOB_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default first retry delay; doubles per attempt.
pub const RETRY_BASE_DEFAULT: Duration = Duration::from_secs(1);
/// Default cap of the retry delay.
pub const RETRY_MAX_DEFAULT: Duration = Duration::from_secs(3600);
/// Default shutdown grace period: in-flight jobs may finish within it.
/// Below Kubernetes' 30 s `terminationGracePeriodSeconds`, so pgwake hands
/// jobs back before it is SIGKILLed.
pub const GRACE_PERIOD_DEFAULT: Duration = Duration::from_secs(20);
/// Default listener ping interval (detects half-open connections).
pub const LISTENER_PING_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
/// Default time a ping may take before the connection counts as dead.
pub const LISTENER_PING_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Default first reconnect delay (listener and claim errors).
pub const RECONNECT_MIN_DEFAULT: Duration = Duration::from_millis(100);
/// Default cap of the reconnect delay.
pub const RECONNECT_MAX_DEFAULT: Duration = Duration::from_secs(10);
/// Longest pause between two start-up checks of a schema that waits for
/// `pgwake migrate` (missing, older, or a migrate running): a check is one
/// connection and a few catalogue reads, and a worker should start soon
/// after the migration ends. The pauses start at `reconnect_min` and double.
pub const SCHEMA_RECHECK_MAX: Duration = Duration::from_secs(2);
/// Default database sampling interval for the queue/pressure gauges.
pub const SAMPLE_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// Default lease of a lease-mode job; a heartbeat renews it every third.
pub const LEASE_DURATION_DEFAULT: Duration = Duration::from_secs(30);
/// Default interval at which every worker moves expired leases back.
pub const RESCUE_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// Default interval at which a worker writes what its running jobs
/// reported of their progress ([`crate::JobContext::progress`]): one
/// statement for every job that reported since the last.
pub const PROGRESS_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Default interval at which a worker checks `pgwake.cancel_requests` for
/// the jobs it runs: the fallback for a cancel whose notification its
/// listener missed (reconnecting, or `--no-listen`). One indexed query per
/// interval, and none while the worker runs nothing.
pub const CANCEL_POLL_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// How much longer than the job timeout the server lets a claim transaction
/// sit idle before it ends the session (backs up the worker's own timeout).
pub const IDLE_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);
/// Longest queue name, in bytes (the schema's CHECK agrees).
pub const QUEUE_NAME_MAX: usize = 128;

/// Longest job timeout (`--job-timeout`, a job's own `timeout`): the claim
/// transaction's statement and idle limits are the timeout in milliseconds,
/// which PostgreSQL holds in 32 bits (24.8 days).
pub const JOB_TIMEOUT_MAX: Duration = Duration::from_secs(24 * 86400);

/// Longest ordering or unique key, in bytes (the unique index refuses
/// entries above about 2.7 KB).
pub const KEY_MAX: usize = 1024;

/// Largest `--max-running` (each unit is a slot row written when the limit
/// is set).
pub const MAX_RUNNING_MAX: i32 = 100_000;

/// The milliseconds PostgreSQL is given for `timeout` as a statement or idle
/// limit: never above what its 32-bit setting holds.
pub(crate) fn server_timeout_ms(timeout: Duration) -> u64 {
    (timeout.as_millis() as u64).min(i32::MAX as u64)
}
/// Most claim tasks one worker may run.
pub const CONCURRENCY_MAX: usize = 1000;
/// Largest batch.
pub const BATCH_MAX: usize = 1000;

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Queues to work (`None`: every queue).
    pub queues: Option<Vec<String>>,
    /// Job slots: jobs that may run at once (a tx-mode batch takes one
    /// slot). Default 8.
    pub concurrency: usize,
    /// Most connections of the claim pool (`--max-connections`). Claim
    /// tasks are this less [`SERVICE_CONNECTIONS`] (and at most
    /// `concurrency`): in tx mode each running batch holds a connection, so
    /// this also bounds the batches running at once; in lease mode jobs hold
    /// none, so `concurrency` can be far above it. `None`: `concurrency` +
    /// [`SERVICE_CONNECTIONS`], capped at [`MAX_CONNECTIONS_TX_DEFAULT`]
    /// when the worker claims in tx mode, at [`MAX_CONNECTIONS_DEFAULT`]
    /// when it claims in lease mode only.
    pub max_connections: Option<usize>,
    /// Lease-mode jobs claimed ahead of the free slots (`--prefetch`), so a
    /// freed slot starts the next job without a round trip; 0 turns it off.
    /// Never from a limited or rate-limited queue. A buffered job is handed
    /// back with its attempt refunded at shutdown, or when no job starts
    /// for [`WorkerConfig::prefetch_wait`]; after a `kill -9` the rescuer
    /// refunds it too and marks it a suspect. `None`: sized by the worker's
    /// start rate, about 50 ms of its starts, at most
    /// [`PREFETCH_CAP_DEFAULT`].
    pub prefetch: Option<usize>,
    /// How long buffered jobs wait while no job starts on this worker
    /// (`--prefetch-wait`): when every slot runs a long job for this long,
    /// the buffer goes back (attempts refunded) for idle workers to take,
    /// and nothing is claimed ahead until a slot starts a job again.
    /// Default [`PREFETCH_WAIT_DEFAULT`].
    pub prefetch_wait: Duration,
    /// Under database pressure (the governor's level above ok), the
    /// all-queues tx-mode claims resume after the last job claimed, and one
    /// claim per this long starts at the head of the claim index instead,
    /// for the jobs that sort before it (claim/choose/cursor.rs), or per
    /// 50 times the last such claim's duration if that is longer. Default
    /// [`PRESSURE_HEAD_SCAN_EVERY_DEFAULT`] (1 s).
    pub pressure_head_scan_every: Duration,
    /// Once a tx-mode claim finds jobs but fewer than it asked for, the
    /// worker's tx claims start at most one per this long, until one takes
    /// a full batch (claim/choose/idle.rs, "pacing"): a steady stream then
    /// gathers into fewer, larger batches — fewer claims, crash marks and
    /// commits, each a WAL flush that producers' commits queue behind and
    /// server time they wait for — at the cost of up to this much pickup
    /// latency for a job that arrives just after a claim. A claim after an
    /// idle wait is not delayed, and a backlog is claimed as fast as its
    /// batches run. Zero: no pacing (every claim as soon as a task is
    /// free). Default [`CLAIM_PACE_DEFAULT`] (5 ms), at most
    /// [`CLAIM_PACE_MAX`]. `pgwake run --claim-pace`.
    pub claim_pace: Duration,
    /// Claims resume after the last job claimed (claim/choose/cursor.rs)
    /// once a transaction has been open 5 s, or sooner, from 1 s, once this
    /// worker has claimed about this many jobs since the transaction began
    /// (its age times the worker's claim rate over the last second): each
    /// such job left an index entry that every claim from the head walks
    /// while the transaction lasts. Zero: from 1 s at any rate. Default
    /// [`HORIZON_HELD_CLAIMS_DEFAULT`] (500: from 1 s at 500 jobs/s or more).
    pub horizon_held_claims: u64,
    /// Most jobs one claim statement takes. In `tx` mode a batch runs its
    /// jobs one after another in one transaction, and its size adapts below
    /// this cap so a batch runs about 100 ms (`tx::TX_BATCH_TARGET`); in
    /// `lease` mode a claim takes one job per free slot, at most this many.
    /// Default 10.
    pub batch: usize,
    /// Fallback poll interval, jittered by ±25%. Default 2 s.
    pub poll_interval: Duration,
    /// LISTEN for wake-ups (false: poll only). Behind PgBouncer in
    /// transaction mode, rather give a listen database (the server itself:
    /// `WorkerBuilder::listen_database`); without one the worker finds the
    /// pooler at start and polls by itself. Default true.
    pub listen: bool,
    /// A job running longer is cancelled and counts as a failed attempt,
    /// in either mode. A job's own `timeout` column overrides it, and a Rust
    /// handler may extend its run (`JobContext::extend_timeout`). Default
    /// 60 s.
    pub job_timeout: Duration,
    /// First retry delay; attempt n waits `retry_base * 2^(n-1)`, capped at
    /// `retry_max`, with equal jitter. Default 1 s.
    pub retry_base: Duration,
    /// Retry delay cap. Default 1 h.
    pub retry_max: Duration,
    /// Time in-flight jobs get to finish after SIGTERM. Default 20 s.
    pub grace_period: Duration,
    /// `application_name` of the worker's connections (the listener's gets
    /// `-listener` appended). Default `pgwake`.
    pub application_name: String,
    /// Listener ping interval. Default 10 s.
    pub listener_ping_interval: Duration,
    /// Listener ping timeout. Default 5 s.
    pub listener_ping_timeout: Duration,
    /// First reconnect delay. Default 100 ms.
    pub reconnect_min: Duration,
    /// Reconnect delay cap. Default 10 s.
    pub reconnect_max: Duration,
    /// Queues whose jobs are all claimed in `lease` mode, whatever their
    /// handlers declare. Default none (the mode follows the handler).
    pub lease_queues: Vec<String>,
    /// Queues whose jobs are all claimed in `tx` mode, whatever their
    /// handlers declare. Default none.
    pub tx_queues: Vec<String>,
    /// Lease of a lease-mode job; renewed by a heartbeat every third of it.
    /// A worker that stops heartbeating loses its jobs after this long.
    /// Default 30 s.
    pub lease_duration: Duration,
    /// How often this worker moves expired leases back to the queue.
    /// Default 5 s.
    pub rescue_interval: Duration,
    /// How often this worker writes the progress its running jobs reported
    /// ([`crate::JobContext::progress`]), one statement for all of them:
    /// how old a value shown by `pgwake job show` may be. Default 1 s.
    pub progress_interval: Duration,
    /// Interval of the database sampling query (queue depth, pressure
    /// gauges); `None` turns sampling off. Default 5 s.
    pub sample_interval: Option<Duration>,
    /// How often this worker looks for cancel requests of the jobs it runs
    /// (the fallback when a cancel notification was missed). Default 1 s.
    pub cancel_poll_interval: Duration,
    /// The recurring-job scheduler (`crate::services::scheduler`); `None` turns it off
    /// on this worker (the other workers still serve every schedule).
    /// Default on, with `SchedulerConfig::default()`.
    pub scheduler: Option<SchedulerConfig>,
    /// How the claim path (claims, outcomes, heartbeats: the statements
    /// that run per job) sends its statements: `Cached` named prepared
    /// statements, or `Unnamed` ones for a transaction-mode pooler. The
    /// other services and every command always send unnamed statements.
    /// Default `Auto`: chosen at start.
    pub prepared_statements: PreparedStatements,
    /// End [`Worker::run`](crate::Worker::run) with the error when the
    /// database cannot be reached at start, or its schema is missing,
    /// older than this binary or being migrated, instead of waiting
    /// (retrying with backoff from `reconnect_min` to `reconnect_max`, at
    /// most [`SCHEMA_RECHECK_MAX`] between schema checks, not ready
    /// meanwhile). A schema newer than the binary ends the start either
    /// way. Default false: wait.
    pub fail_fast: bool,
    /// History of finished jobs and its retention (`crate::admin::history`).
    /// Default: leave the database's setting as it is (history is off
    /// unless turned on).
    pub history: HistoryConfig,
    /// The per-minute rollup of outcomes (`pgwake stats`, the console's
    /// charts; `crate::services::rollup`); `None` turns it off on this
    /// worker. Default on, with `RollupConfig::default()`.
    pub rollup: Option<RollupConfig>,
    /// Trace jobs (`crate::trace`): each claim reads its jobs' stored W3C
    /// contexts (one statement), each job gets `pgwake.job`, `pgwake.run`
    /// and `pgwake.outcome` spans (parented on the producer's context with
    /// the `otel` feature), its log lines carry its trace id, and handlers
    /// get the context ([`crate::JobContext::traceparent`]; `TRACEPARENT`
    /// for `exec`). The `pgwake` binary turns it on with an OTLP endpoint
    /// or `--trace-jobs`. Default false: the claim path does none of it.
    pub trace_jobs: bool,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            queues: None,
            concurrency: CONCURRENCY_DEFAULT,
            max_connections: None,
            prefetch: None,
            prefetch_wait: PREFETCH_WAIT_DEFAULT,
            pressure_head_scan_every: PRESSURE_HEAD_SCAN_EVERY_DEFAULT,
            claim_pace: CLAIM_PACE_DEFAULT,
            horizon_held_claims: HORIZON_HELD_CLAIMS_DEFAULT,
            batch: BATCH_DEFAULT,
            poll_interval: POLL_INTERVAL_DEFAULT,
            listen: true,
            job_timeout: JOB_TIMEOUT_DEFAULT,
            retry_base: RETRY_BASE_DEFAULT,
            retry_max: RETRY_MAX_DEFAULT,
            grace_period: GRACE_PERIOD_DEFAULT,
            application_name: APPLICATION_NAME_DEFAULT.into(),
            listener_ping_interval: LISTENER_PING_INTERVAL_DEFAULT,
            listener_ping_timeout: LISTENER_PING_TIMEOUT_DEFAULT,
            reconnect_min: RECONNECT_MIN_DEFAULT,
            reconnect_max: RECONNECT_MAX_DEFAULT,
            lease_queues: Vec::new(),
            lease_duration: LEASE_DURATION_DEFAULT,
            tx_queues: Vec::new(),
            rescue_interval: RESCUE_INTERVAL_DEFAULT,
            progress_interval: PROGRESS_INTERVAL_DEFAULT,
            sample_interval: Some(SAMPLE_INTERVAL_DEFAULT),
            cancel_poll_interval: CANCEL_POLL_INTERVAL_DEFAULT,
            scheduler: Some(SchedulerConfig::default()),
            prepared_statements: PREPARED_STATEMENTS_DEFAULT,
            fail_fast: false,
            history: HistoryConfig::default(),
            rollup: Some(RollupConfig::default()),
            trace_jobs: false,
        }
    }
}

/// Check a queue name: non-empty, at most 128 bytes, no control characters.
/// Queue names are data (bound parameters, NOTIFY payloads), never SQL.
pub fn validate_queue_name(name: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Config("queue name is empty".into()));
    }
    if name.len() > QUEUE_NAME_MAX {
        return Err(Error::Config(format!(
            "queue name {:?}… is longer than {QUEUE_NAME_MAX} bytes",
            name.chars().take(20).collect::<String>()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(Error::Config(format!(
            "queue name {name:?} contains control characters"
        )));
    }
    Ok(())
}

/// The names of a comma-separated list flag (`--queues a,b`): split at every
/// comma, except one written `\,`, which is part of the name (`a\,b,c` is
/// `a,b` and `c`); `\\` is one backslash, and a backslash before any other
/// character is kept as it is. Nothing is trimmed; an empty item stays, for
/// validation to refuse.
pub fn split_names(list: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut name = String::new();
    let mut chars = list.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if matches!(chars.peek(), Some(',' | '\\')) => name.extend(chars.next()),
            ',' => names.push(std::mem::take(&mut name)),
            c => name.push(c),
        }
    }
    names.push(name);
    names
}

/// Names as one comma-separated list that [`split_names`] reads back: each
/// comma and backslash inside a name escaped with a backslash.
pub fn join_names<S: AsRef<str>>(names: &[S]) -> String {
    names
        .iter()
        .map(|n| n.as_ref().replace('\\', r"\\").replace(',', r"\,"))
        .collect::<Vec<_>>()
        .join(",")
}

impl WorkerConfig {
    /// The claim pool's size: `max_connections`, or by default
    /// `concurrency` + [`SERVICE_CONNECTIONS`], capped at
    /// [`MAX_CONNECTIONS_TX_DEFAULT`] when `tx` (the worker has tx-mode
    /// claims, whose running batches hold a connection each) and at
    /// [`MAX_CONNECTIONS_DEFAULT`] otherwise.
    pub fn connections(&self, tx: bool) -> usize {
        self.max_connections.unwrap_or_else(|| {
            let cap = if tx {
                MAX_CONNECTIONS_TX_DEFAULT
            } else {
                MAX_CONNECTIONS_DEFAULT
            };
            (self.concurrency + SERVICE_CONNECTIONS).min(cap)
        })
    }

    /// The most jobs the lease prefetch buffer holds (0: off): `prefetch`,
    /// or by default [`PREFETCH_CAP_DEFAULT`] (the default buffer is sized
    /// by the start rate below it).
    pub fn prefetch_jobs(&self) -> usize {
        self.prefetch.unwrap_or(PREFETCH_CAP_DEFAULT)
    }

    /// Claim tasks: one per connection left beside the services' (a tx
    /// batch holds its task's connection while it runs, so these bound the
    /// tx batches running at once), never more than the slots, at least
    /// one. `tx`: as for [`connections`](Self::connections).
    pub fn claim_tasks(&self, tx: bool) -> usize {
        self.connections(tx)
            .saturating_sub(SERVICE_CONNECTIONS)
            .min(self.concurrency)
            .max(1)
    }

    /// Reject settings the worker cannot run with; the message names the
    /// setting (as the `pgwake run` flag where there is one, else as the
    /// field) and the accepted range.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(Error::Config(msg));
        self.history.validate()?;
        if let Some(rollup) = &self.rollup {
            rollup.validate()?;
        }
        if self.concurrency == 0 || self.concurrency > CONCURRENCY_MAX {
            return bad(format!(
                "--concurrency must be between 1 and {CONCURRENCY_MAX} (got {})",
                self.concurrency
            ));
        }
        if let Some(n) = self.max_connections {
            let most = CONCURRENCY_MAX + SERVICE_CONNECTIONS;
            if !(MAX_CONNECTIONS_MIN..=most).contains(&n) {
                return bad(format!(
                    "--max-connections must be between {MAX_CONNECTIONS_MIN} (one for claims, one for heartbeats, outcomes and the other services) and {most} (got {n}); omit it for --concurrency + {SERVICE_CONNECTIONS}, at most {MAX_CONNECTIONS_TX_DEFAULT} with tx-mode handlers and {MAX_CONNECTIONS_DEFAULT} without"
                ));
            }
        }
        if self.prefetch.is_some_and(|n| n > PREFETCH_MAX) {
            return bad(format!(
                "--prefetch must be between 0 (off) and {PREFETCH_MAX} (got {}); omit it for about 50 ms of the worker's starts, at most {PREFETCH_CAP_DEFAULT}",
                self.prefetch.unwrap_or_default()
            ));
        }
        if self.batch == 0 || self.batch > BATCH_MAX {
            return bad(format!(
                "--batch must be between 1 and {BATCH_MAX} (got {})",
                self.batch
            ));
        }
        if let Some(queues) = &self.queues {
            if queues.is_empty() {
                return bad("--queues is empty; omit it to work every queue".into());
            }
            for q in queues {
                validate_queue_name(q).map_err(|e| Error::Config(format!("--queues: {e}")))?;
            }
        }
        for q in &self.lease_queues {
            validate_queue_name(q).map_err(|e| Error::Config(format!("--lease-queues: {e}")))?;
        }
        for q in &self.tx_queues {
            validate_queue_name(q).map_err(|e| Error::Config(format!("--tx-queues: {e}")))?;
            if self.lease_queues.contains(q) {
                return bad(format!(
                    "queue {q:?} is in both --tx-queues and --lease-queues; pick one mode"
                ));
            }
        }
        if self.lease_duration < Duration::from_secs(1) {
            return bad("--lease-duration must be at least 1s".into());
        }
        if self.claim_pace > CLAIM_PACE_MAX {
            return bad(format!(
                "--claim-pace (WorkerConfig::claim_pace) must be between 0 (off) and {CLAIM_PACE_MAX:?} (got {:?})",
                self.claim_pace
            ));
        }
        for (setting, d) in [
            ("--rescue-interval", self.rescue_interval),
            ("--progress-interval", self.progress_interval),
            ("--poll-interval", self.poll_interval),
            ("--cancel-poll-interval", self.cancel_poll_interval),
            ("--job-timeout", self.job_timeout),
            ("--retry-base", self.retry_base),
            ("--retry-max", self.retry_max),
            // Library-only settings: no flag, so the field is named.
            (
                "WorkerConfig::listener_ping_interval",
                self.listener_ping_interval,
            ),
            (
                "WorkerConfig::listener_ping_timeout",
                self.listener_ping_timeout,
            ),
            ("WorkerConfig::reconnect_min", self.reconnect_min),
            ("WorkerConfig::reconnect_max", self.reconnect_max),
        ] {
            if d.is_zero() {
                return bad(format!("{setting} must be greater than 0"));
            }
        }
        if self.job_timeout > JOB_TIMEOUT_MAX {
            return bad(format!(
                "--job-timeout must be at most 24 days (PostgreSQL holds the claim's statement limit in milliseconds, 32 bits); got {}",
                humantime::format_duration(self.job_timeout)
            ));
        }
        if self.job_timeout < Duration::from_millis(10) {
            return bad("--job-timeout must be at least 10ms".into());
        }
        if self.prefetch_wait < Duration::from_millis(10) {
            return bad(format!(
                "--prefetch-wait must be at least 10ms (got {}); omit it for {}",
                humantime::format_duration(self.prefetch_wait),
                humantime::format_duration(PREFETCH_WAIT_DEFAULT)
            ));
        }
        if self.retry_max < self.retry_base {
            return bad("--retry-max must not be below --retry-base".into());
        }
        if self.reconnect_max < self.reconnect_min {
            return bad(
                "WorkerConfig::reconnect_max must not be below WorkerConfig::reconnect_min".into(),
            );
        }
        if matches!(self.sample_interval, Some(d) if d.is_zero()) {
            return bad("--sample-interval must be greater than 0".into());
        }
        if self.application_name.is_empty() || self.application_name.len() > 48 {
            return bad("--application-name must be 1 to 48 bytes".into());
        }
        if let Some(scheduler) = &self.scheduler {
            scheduler.validate()?;
        }
        Ok(())
    }

    /// The backoff before attempt `attempt + 1` after attempt `attempt`
    /// failed: exponential, capped, with equal jitter (half fixed, half
    /// random) so a burst of failures does not retry in lockstep.
    pub fn retry_delay(&self, attempt: i32) -> Duration {
        let full = self.retry_delay_max(attempt);
        let half = full / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// The longest backoff after failed attempt `attempt`:
    /// `retry_base · 2^(attempt-1)`, capped at `retry_max`. The jittered
    /// delay lies between half of it and all of it.
    pub fn retry_delay_max(&self, attempt: i32) -> Duration {
        let exp = (attempt.max(1) - 1).min(30) as u32;
        self.retry_base
            .saturating_mul(1u32 << exp)
            .min(self.retry_max)
    }

    /// The queues as a person writes them, for logs: `all`, or `a,b` (as
    /// `--queues` takes them: see [`join_names`]).
    pub fn queues_label(&self) -> String {
        match &self.queues {
            None => "all".into(),
            Some(q) => join_names(q),
        }
    }

    /// Delays between reconnect or retry attempts after a database error:
    /// exponential from `reconnect_min`, capped at `reconnect_max`, jittered,
    /// unbounded in count.
    pub(crate) fn reconnect_backoff(&self) -> impl Iterator<Item = Duration> {
        reconnect_backoff(self.reconnect_min, self.reconnect_max)
    }

    /// The server-side idle-in-transaction limit of a claim transaction.
    pub fn idle_in_transaction_timeout(&self) -> Duration {
        Duration::from_millis(server_timeout_ms(self.job_timeout + IDLE_TIMEOUT_MARGIN))
    }
}

/// Exponential backoff from `min` to `max`, jittered, never giving up.
pub(crate) fn reconnect_backoff(min: Duration, max: Duration) -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_jitter()
        .without_max_times()
        .build()
}

// History of finished jobs.

/// How often each worker reads the history setting and (one worker at a
/// time) maintains the partitions.
pub const MAINTENANCE_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
/// Daily partitions created ahead of today (UTC).
pub const PARTITIONS_AHEAD_DEFAULT: i32 = 2;
/// How long a partition's CREATE or DROP waits for its lock before giving
/// up until the next round (history writes queue behind it meanwhile;
/// producers and claims never touch the history table).
pub const MAINTENANCE_LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_millis(100);
/// Shortest `--keep-finished`: partitions are daily, so a shorter setting
/// would keep rows up to a day anyway.
pub const KEEP_FINISHED_MIN: Duration = Duration::from_secs(3600);

/// What a worker does to the database's history setting at start-up.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepFinished {
    /// Leave it as it is and follow it (the default: history stays off
    /// unless someone turned it on).
    #[default]
    Unchanged,
    /// Turn history off for the database (`--keep-finished off`).
    Off,
    /// Turn it on, keeping finished jobs at least this long (and at most a
    /// day longer: partitions are dropped whole).
    Keep(Duration),
}

impl KeepFinished {
    /// Parse `off` or a duration (`7d`, `36h`).
    pub fn parse(s: &str) -> std::result::Result<KeepFinished, String> {
        if s == "off" {
            return Ok(KeepFinished::Off);
        }
        let d = humantime::parse_duration(s)
            .map_err(|e| format!("{e}; expected a duration such as 7d or 36h, or `off`"))?;
        Ok(KeepFinished::Keep(d))
    }
}

/// Default time between two flushes of a worker's counts.
pub const ROLLUP_FLUSH_INTERVAL_DEFAULT: Duration = Duration::from_secs(5);
/// Default time a minute's counts are kept (48 h).
pub const ROLLUP_RETENTION_DEFAULT: Duration = Duration::from_secs(48 * 3600);
/// Shortest retention accepted: the console's charts and `pgwake stats`
/// read the last hour.
pub const ROLLUP_RETENTION_MIN: Duration = Duration::from_secs(3600);

/// How the rollup runs (the worker's `--stats-*` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RollupConfig {
    /// Time between two flushes; a SIGKILL loses at most this much of the
    /// worker's counts. Default [`ROLLUP_FLUSH_INTERVAL_DEFAULT`].
    pub flush_interval: Duration,
    /// Minutes older than this are deleted. Default [`ROLLUP_RETENTION_DEFAULT`];
    /// at least [`ROLLUP_RETENTION_MIN`]. Workers with different settings: the
    /// shortest wins.
    pub retention: Duration,
}

impl Default for RollupConfig {
    fn default() -> Self {
        RollupConfig {
            flush_interval: ROLLUP_FLUSH_INTERVAL_DEFAULT,
            retention: ROLLUP_RETENTION_DEFAULT,
        }
    }
}

impl RollupConfig {
    /// Check the settings; the error names the flag and the fix.
    pub fn validate(&self) -> Result<()> {
        if self.flush_interval.is_zero() || self.flush_interval > Duration::from_secs(3600) {
            return Err(Error::Config(format!(
                "--stats-flush-interval must be between 1ms and 1h (a SIGKILL loses up to this much of the worker's counts); got {:?}",
                self.flush_interval
            )));
        }
        if self.retention < ROLLUP_RETENTION_MIN
            || self.retention > Duration::from_secs(366 * 86400)
        {
            return Err(Error::Config(format!(
                "--stats-retention must be between 1 h and 366 days (`pgwake stats` and the console read the last hour); got {:?}",
                self.retention
            )));
        }
        Ok(())
    }
}

/// History settings of a worker.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Set the database's history setting at start-up. Default
    /// [`KeepFinished::Unchanged`].
    pub keep_finished: KeepFinished,
    /// How often the setting is re-read and partitions maintained. Default
    /// 60 s ([`MAINTENANCE_INTERVAL_DEFAULT`]).
    pub maintenance_interval: Duration,
    /// Daily partitions created ahead. Default 2
    /// ([`PARTITIONS_AHEAD_DEFAULT`]).
    pub partitions_ahead: i32,
    /// Lock wait of one partition CREATE/DROP. Default 100 ms
    /// ([`MAINTENANCE_LOCK_TIMEOUT_DEFAULT`]).
    pub lock_timeout: Duration,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            keep_finished: KeepFinished::Unchanged,
            maintenance_interval: MAINTENANCE_INTERVAL_DEFAULT,
            partitions_ahead: PARTITIONS_AHEAD_DEFAULT,
            lock_timeout: MAINTENANCE_LOCK_TIMEOUT_DEFAULT,
        }
    }
}

impl HistoryConfig {
    /// The defaults, with the history setting `keep_finished` set at
    /// start-up.
    pub fn keeping(keep_finished: KeepFinished) -> HistoryConfig {
        HistoryConfig {
            keep_finished,
            ..HistoryConfig::default()
        }
    }

    /// Check the settings; the error names the flag.
    pub fn validate(&self) -> Result<()> {
        if let KeepFinished::Keep(d) = self.keep_finished {
            if d < KEEP_FINISHED_MIN {
                return Err(Error::Config(format!(
                    "--keep-finished {}: at least 1h (history is partitioned by day and dropped a day at a time); use `off` to turn history off",
                    humantime::format_duration(d)
                )));
            }
            if d > Duration::from_secs(100 * 365 * 24 * 3600) {
                return Err(Error::Config("--keep-finished: at most 100 years".into()));
            }
        }
        if self.maintenance_interval.is_zero() {
            return Err(Error::Config(
                "history maintenance interval must be positive".into(),
            ));
        }
        if !(0..=366).contains(&self.partitions_ahead) {
            return Err(Error::Config(
                "history partitions ahead: 0 to 366 days".into(),
            ));
        }
        Ok(())
    }
}

// The scheduler.

/// Default longest sleep between rounds: a schedule added (or redefined)
/// while every scheduler sleeps is seen within this.
pub const SCHEDULER_MAX_SLEEP_DEFAULT: Duration = Duration::from_secs(5);
/// Default schedules claimed per transaction.
pub const SCHEDULER_BATCH_DEFAULT: i64 = 100;
/// Sleep after a failed round (database down, a schedule whose jobs cannot
/// be inserted) before trying again.
pub const SCHEDULER_ERROR_PAUSE_DEFAULT: Duration = Duration::from_secs(1);

/// How the scheduler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Longest sleep between rounds. Default `SCHEDULER_MAX_SLEEP_DEFAULT` (5 s).
    pub max_sleep: Duration,
    /// Schedules claimed per transaction. Default `SCHEDULER_BATCH_DEFAULT` (100).
    pub batch: i64,
    /// Pause after a failed round. Default `SCHEDULER_ERROR_PAUSE_DEFAULT` (1 s).
    pub error_pause: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_sleep: SCHEDULER_MAX_SLEEP_DEFAULT,
            batch: SCHEDULER_BATCH_DEFAULT,
            error_pause: SCHEDULER_ERROR_PAUSE_DEFAULT,
        }
    }
}

impl SchedulerConfig {
    /// Check the settings; the error names the bad one.
    pub fn validate(&self) -> Result<()> {
        if self.max_sleep < Duration::from_millis(10) {
            return Err(Error::Config(
                "scheduler max_sleep must be at least 10ms".into(),
            ));
        }
        if !(1..=10_000).contains(&self.batch) {
            return Err(Error::Config(
                "scheduler batch must be between 1 and 10000".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comma_or_backslash_in_a_name_survives_a_list() {
        assert_eq!(split_names("a,b"), ["a", "b"]);
        assert_eq!(split_names(r"a\,b,c"), ["a,b", "c"]);
        assert_eq!(split_names(r"a\\,b"), [r"a\", "b"]);
        assert_eq!(split_names(r"C:\x"), [r"C:\x"]);
        assert_eq!(split_names("a,,b"), ["a", "", "b"]);
        assert_eq!(split_names(""), [""]);
        for names in [
            vec!["a,b", "c"],
            vec![r"a\", "b"],
            vec![r"\,", r",\", "x y", r"a\b"],
        ] {
            assert_eq!(
                split_names(&join_names(&names)),
                names,
                "{}",
                join_names(&names)
            );
        }
    }

    #[test]
    fn retry_delay_grows_and_is_capped() {
        let c = WorkerConfig {
            retry_base: Duration::from_secs(1),
            retry_max: Duration::from_secs(10),
            ..WorkerConfig::default()
        };
        for _ in 0..100 {
            let d1 = c.retry_delay(1);
            assert!(d1 >= Duration::from_millis(500) && d1 <= Duration::from_secs(1));
            let d3 = c.retry_delay(3);
            assert!(d3 >= Duration::from_secs(2) && d3 <= Duration::from_secs(4));
            assert!(c.retry_delay(40) <= Duration::from_secs(10));
        }
    }

    /// `1 h 5 min`, as the docs write durations.
    fn hours_minutes(d: Duration) -> String {
        let m = d.as_secs() / 60;
        format!("{} h {} min", m / 60, m % 60)
    }

    #[test]
    fn the_docs_state_how_long_a_failing_job_takes_to_die_at_the_defaults() {
        let c = WorkerConfig::default();
        let waits: Vec<Duration> = (1..MAX_ATTEMPTS_DEFAULT)
            .map(|a| c.retry_delay_max(a))
            .collect();
        let max: Duration = waits.iter().sum();
        assert_eq!(max, Duration::from_secs(47_295));
        let readme = include_str!("../docs/src/producing.md");
        for figure in [
            "47,295 s".to_string(),
            hours_minutes(max / 2),
            hours_minutes(max),
            hours_minutes(max.mul_f64(0.75)),
        ] {
            assert!(
                readme.contains(&figure),
                "docs/src/producing.md lacks {figure}"
            );
        }
        for _ in 0..10 {
            for a in 1..MAX_ATTEMPTS_DEFAULT {
                let d = c.retry_delay(a);
                assert!(d >= c.retry_delay_max(a) / 2 && d <= c.retry_delay_max(a));
            }
        }
    }

    #[test]
    fn validate_names_the_flag() {
        let c = WorkerConfig {
            concurrency: 0,
            ..WorkerConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--concurrency"));
        let c = WorkerConfig {
            queues: Some(vec!["".into()]),
            ..WorkerConfig::default()
        };
        assert!(c.validate().unwrap_err().to_string().contains("--queues"));
        assert!(WorkerConfig::default().validate().is_ok());
        let c = WorkerConfig {
            max_connections: Some(1),
            ..WorkerConfig::default()
        };
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("--max-connections"));
    }

    #[test]
    fn slots_are_not_connections() {
        let at = |concurrency, max_connections| WorkerConfig {
            concurrency,
            max_connections,
            ..WorkerConfig::default()
        };
        let pool = |c: WorkerConfig, tx| (c.connections(tx), c.claim_tasks(tx));
        for tx in [false, true] {
            // The defaults: one claim task per slot, two more connections.
            assert_eq!(pool(at(8, None), tx), (10, 8));
            assert_eq!(pool(at(1, None), tx), (3, 1));
            // Set: as set.
            assert_eq!(pool(at(300, Some(4)), tx), (4, 2));
            assert_eq!(at(300, Some(2)).claim_tasks(tx), 1);
            assert_eq!(at(2, Some(50)).claim_tasks(tx), 2);
        }
        // Lease only: many slots, a few connections.
        assert_eq!(pool(at(300, None), false), (10, 8));
        assert_eq!(pool(at(64, None), false), (10, 8));
        // tx: every slot can run a batch at once, up to the cap.
        assert_eq!(pool(at(16, None), true), (18, 16));
        assert_eq!(pool(at(64, None), true), (66, 64));
        assert_eq!(
            pool(at(300, None), true),
            (MAX_CONNECTIONS_TX_DEFAULT, MAX_CONNECTIONS_TX_DEFAULT - 2)
        );
    }

    #[test]
    fn keep_finished_parses_off_and_durations() {
        assert_eq!(KeepFinished::parse("off"), Ok(KeepFinished::Off));
        assert_eq!(
            KeepFinished::parse("7d"),
            Ok(KeepFinished::Keep(Duration::from_secs(7 * 86400)))
        );
        assert!(KeepFinished::parse("soon").is_err());
        let short = HistoryConfig {
            keep_finished: KeepFinished::Keep(Duration::from_secs(60)),
            ..HistoryConfig::default()
        };
        assert!(short.validate().is_err());
    }
}
