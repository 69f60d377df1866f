//! The command line's argument types (clap). Defaults come from the
//! library's `*_DEFAULT` constants, so `--help`, the docs and the library
//! agree.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use clap::{Args, Parser, Subcommand};
use pgwake::config;
use pgwake::error::Error;

pub use super::database::Db;

/// A PostgreSQL job-queue worker: insert trigger → LISTEN → SKIP LOCKED
/// claims → handlers, with Prometheus metrics.
#[derive(Parser)]
#[command(name = "pgwake", version, about, long_about = None)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    pub log_format: String,
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand)]
pub enum Command {
    /// Run the worker.
    Run(Box<RunArgs>),
    /// Create or upgrade the pgwake schema (safe to run concurrently).
    Migrate(Db),
    /// Enqueue a job, or many from NDJSON on stdin.
    Enqueue(EnqueueArgs),
    /// Per-queue depth, dead count and oldest ready age, and what ran recently (done,
    /// retried, dead, jobs/s) from the per-minute rollup.
    Stats {
        #[command(flatten)]
        db: Db,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The window of "what ran": this long back from now, whole minutes (1m to 7d).
        #[arg(long, value_parser = duration, default_value = "1h")]
        since: HumanDuration,
    },
    /// Check the database for what breaks queues in production (vacuum horizon, autovacuum,
    /// dead tuples, timeouts, connections, NOTIFY, schema, workers) and print each finding
    /// with its fix. Exits 0 all ok, 1 a warning, 2 a problem, 3 when the checks could not run.
    Doctor(super::doctor::DoctorArgs),
    /// List, retry and purge dead jobs.
    Dead {
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Finished jobs and their results, newest first (history is on once a
    /// worker ran with --keep-finished).
    History(HistoryArgs),
    /// Cancel jobs: waiting ones leave the queue, running ones are stopped; both end in
    /// dead_jobs as cancelled. Exits 2 if any id is unknown, finished or already dead.
    Cancel(super::cancel::CancelArgs),
    /// Batches: a callback job that runs once after every job of the batch has ended, whatever
    /// their outcomes: open, close, status.
    Batch {
        #[command(subcommand)]
        action: super::batch::BatchAction,
    },
    /// Send a signal: every job waiting for KEY (Outcome::WaitFor) resumes with the payload; one
    /// that wakes no job is kept (24h by default) for the first job that waits for KEY.
    Signal(super::signal::SignalArgs),
    /// Queue settings, read by every worker without a restart: list, pause, resume, set; and pressure (what a queue has for workers now).
    Queue {
        #[command(subcommand)]
        action: super::queue::QueueAction,
    },
    /// The database pressure (a held vacuum horizon, dead tuples, the NOTIFY queue): show
    /// the level with its causes and thresholds; set the thresholds.
    Pressure {
        #[command(subcommand)]
        action: super::pressure::PressureAction,
    },
    /// List jobs in every state, filtered (queue, task, state, keys, payload).
    Jobs {
        #[command(subcommand)]
        action: super::jobs::JobsAction,
    },
    /// Show one job: payload, attempts, errors, result, history, and why it is not running.
    Job {
        #[command(subcommand)]
        action: super::jobs::JobAction,
    },
    /// Why isn't job ID running? Each reason and what will end it.
    Explain(super::jobs::IdArgs),
    /// Recurring jobs: add, list, remove, disable and enable cron schedules.
    Schedule {
        #[command(subcommand)]
        action: super::schedule::ScheduleAction,
    },
    /// Serve the operator console: web pages of queues, jobs (and why they wait), workers and
    /// schedules; read-only unless --ui-actions.
    Ui(super::ui::UiArgs),
    /// Check that a persistent handler command follows the line protocol (docs/src/protocol.md).
    Protocol {
        #[command(subcommand)]
        action: super::protocol::ProtocolAction,
    },
    /// Measure throughput, pickup latency and producer cost against the raw-SQL ceiling.
    Bench(crate::bench::BenchArgs),
    /// Run a demo on a throwaway PostgreSQL (or --database-url), then keep it up to look
    /// around until Ctrl-C.
    Demo(DemoArgs),
}

/// `pgwake demo` flags.
#[derive(Args)]
pub struct DemoArgs {
    /// Use this database instead of a throwaway cluster.
    #[arg(long)]
    pub database_url: Option<String>,
    #[arg(long, help = format!(
        "Where to serve /metrics [default: {}, or a free port if that is taken]",
        config::METRICS_ADDR_DEFAULT
    ))]
    pub metrics_addr: Option<SocketAddr>,
    #[arg(long, help = format!(
        "Where to serve the read-only console [default: {}, or a free port if that is taken]; \
         on an address other than loopback reading needs PGWAKE_UI_TOKEN (operators log in)",
        pgwake::console::UI_ADDR_DEFAULT
    ))]
    pub ui_addr: Option<SocketAddr>,
    #[command(flatten)]
    pub console: super::ui::ConsoleFlags,
}

/// A duration flag: `500ms`, `2s`, `1m`, `1h 30m`. Displayed the same way,
/// so defaults print as the user would type them.
pub type HumanDuration = humantime::Duration;

fn task_name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("the task name must not be empty".into());
    }
    Ok(s.to_string())
}

fn queue_name(s: &str) -> Result<String, String> {
    config::validate_queue_name(s).map_err(|e| match e {
        Error::Config(m) => m,
        other => other.to_string(),
    })?;
    Ok(s.to_string())
}

/// The names of one occurrence of a list flag such as `--queues`
/// ([`config::split_names`]: comma-separated, `\,` for a comma in a name).
#[derive(Clone, Debug)]
pub struct NameList(pub Vec<String>);

fn name_list(s: &str) -> Result<NameList, String> {
    Ok(NameList(config::split_names(s)))
}

/// Every name of every occurrence of a list flag, in order.
pub fn names(lists: &[NameList]) -> Vec<String> {
    lists.iter().flat_map(|l| l.0.iter().cloned()).collect()
}

pub(crate) fn duration(s: &str) -> Result<HumanDuration, String> {
    s.parse::<HumanDuration>()
        .map_err(|e| format!("{e} (examples: 500ms, 2s, 1m)"))
}

fn human(d: Duration) -> HumanDuration {
    d.into()
}

/// `pgwake run` flags.
#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub db: Db,
    /// LISTEN through this database URL instead of DATABASE_URL, e.g. when
    /// claims go through PgBouncer in transaction mode (which cannot LISTEN).
    #[arg(long, env = "PGWAKE_LISTEN_DATABASE_URL", hide_env_values = true)]
    pub listen_database_url: Option<String>,
    /// How the claim path sends statements: `auto` (`unnamed` when a transaction-mode pooler
    /// is found at start, else `cached`), `cached` (named prepared statements, prepared once
    /// per connection: direct or session pooling) or `unnamed` (never a named prepared statement:
    /// PgBouncer in transaction mode).
    #[arg(long, env = "PGWAKE_PREPARED_STATEMENTS", value_name = "auto|cached|unnamed",
          default_value_t = config::PREPARED_STATEMENTS_DEFAULT)]
    pub prepared_statements: config::PreparedStatements,
    /// Handler per task: TASK=exec:COMMAND [ARGS] or TASK=sql:[SCHEMA.]FUNCTION; `*` matches
    /// every task. Repeatable, one per task.
    #[arg(long = "handler", value_name = "TASK=KIND:SPEC", required = true)]
    pub handlers: Vec<String>,
    /// Queues to work (default: all): comma-separated, repeatable; a comma in a name is
    /// written \, ('a\,b,c' is the queues "a,b" and "c").
    #[arg(long, value_name = "Q,…", value_parser = name_list)]
    pub queues: Option<Vec<NameList>>,
    /// Job slots = jobs that may run at once (1–1000). A tx batch takes one slot and holds a
    /// claim connection while it runs, so with tx-mode handlers the claim pool's default grows
    /// with this: up to 64 tx batches at once (above that the worker says so at start; raise
    /// --max-connections). Lease-mode jobs hold no connection.
    #[arg(long, default_value_t = config::CONCURRENCY_DEFAULT, allow_negative_numbers = true)]
    pub concurrency: usize,
    /// Most connections of the claim pool (default: --concurrency + 2, at most 66 with tx-mode
    /// handlers, at most 10 for a lease-only worker). Claim tasks are this less 2 (kept for
    /// heartbeats, outcome writes and the other services), so in tx mode it bounds the batches
    /// running at once; lease-mode jobs hold no connection, so --concurrency can be far above it.
    #[arg(long, env = "PGWAKE_MAX_CONNECTIONS", allow_negative_numbers = true)]
    pub max_connections: Option<usize>,
    /// Lease-mode jobs claimed ahead of the free slots (0–1000, 0: off; default: about 50 ms of
    /// the worker's starts, at most 1000), so a freed slot starts the next job without a round
    /// trip. Never from a limited or rate-limited queue; handed back (attempt refunded) at
    /// shutdown or when no job starts for --prefetch-wait; after a kill -9 the rescuer refunds
    /// the buffered jobs too.
    #[arg(long, env = "PGWAKE_PREFETCH", allow_negative_numbers = true)]
    pub prefetch: Option<usize>,
    /// How long prefetched jobs wait while no job starts on this worker: when every slot runs a
    /// long job for this long, the buffered jobs go back (attempts refunded) for idle workers to
    /// take, and nothing is claimed ahead until a slot starts a job again.
    #[arg(long, value_parser = duration, default_value_t = human(config::PREFETCH_WAIT_DEFAULT))]
    pub prefetch_wait: HumanDuration,
    /// Most jobs per claim (1–1000). In tx mode a batch runs its jobs one after another in one
    /// transaction and is sized by time below this (about 100 ms a batch), so slow jobs already
    /// run one per transaction and --batch 1 is rarely worth setting; in lease mode a claim
    /// takes one job per free slot, at most this many.
    #[arg(long, default_value_t = config::BATCH_DEFAULT, allow_negative_numbers = true)]
    pub batch: usize,
    /// After a tx claim finds fewer jobs than it asked for, tx claims start at most one per this
    /// long (0–1s, 0: off) until one fills its batch: a steady stream is taken in fewer, larger
    /// batches (fewer commits and round trips, for the producers' sake) at the cost of up to this
    /// much pickup latency. A claim after an idle wait and a backlog are never delayed.
    #[arg(long, env = "PGWAKE_CLAIM_PACE", value_parser = duration,
          default_value_t = human(config::CLAIM_PACE_DEFAULT))]
    pub claim_pace: HumanDuration,
    /// Fallback poll interval (jittered ±25%).
    #[arg(long, value_parser = duration, default_value_t = human(config::POLL_INTERVAL_DEFAULT))]
    pub poll_interval: HumanDuration,
    /// Poll only; no LISTEN. Behind PgBouncer in transaction mode, rather give
    /// --listen-database-url (the server itself): the worker polls by itself when LISTEN
    /// would go through the pooler.
    #[arg(long)]
    pub no_listen: bool,
    /// Exit 1 when the database cannot be reached at start, or its schema is missing, older
    /// than this pgwake or being migrated, instead of waiting (retrying with backoff up to 10 s,
    /// every 2 s at most for the schema; /ready answering 503 meanwhile). A schema newer than
    /// this pgwake exits 2 either way.
    #[arg(long, env = "PGWAKE_FAIL_FAST")]
    pub fail_fast: bool,
    /// Trace jobs: read each claimed job's stored trace context, run it in spans parented on
    /// its producer's, put its trace id in its log lines and give its handler the context
    /// (TRACEPARENT for exec). On by itself when spans are exported (an OTLP endpoint set).
    #[arg(long, env = "PGWAKE_TRACE_JOBS")]
    pub trace_jobs: bool,
    /// Export the jobs' spans over OTLP to this collector: its base address, e.g.
    /// http://localhost:4318 (http/protobuf; /v1/traces is added) or http://localhost:4317
    /// (grpc). OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT do the same.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// The OTLP protocol: grpc or http/protobuf [default: OTEL_EXPORTER_OTLP_PROTOCOL, else
    /// http/protobuf].
    #[arg(long, value_name = "PROTOCOL")]
    pub otlp_protocol: Option<String>,
    /// Per-job timeout; a job running longer fails its attempt.
    #[arg(long, value_parser = duration, default_value_t = human(config::JOB_TIMEOUT_DEFAULT))]
    pub job_timeout: HumanDuration,
    /// First retry delay (doubles per attempt, equal jitter).
    #[arg(long, value_parser = duration, default_value_t = human(config::RETRY_BASE_DEFAULT))]
    pub retry_base: HumanDuration,
    /// Retry delay cap.
    #[arg(long, value_parser = duration, default_value_t = human(config::RETRY_MAX_DEFAULT))]
    pub retry_max: HumanDuration,
    /// Time in-flight jobs get to finish after SIGTERM/SIGINT/SIGHUP.
    #[arg(long, value_parser = duration, default_value_t = human(config::GRACE_PERIOD_DEFAULT))]
    pub grace_period: HumanDuration,
    /// Queues whose jobs all run in lease mode, whatever their handler declares (like
    /// --queues: comma-separated, repeatable, \, for a comma in a name). Default: the mode
    /// follows the handler (exec: lease; sql: tx).
    #[arg(long, value_name = "Q,…", value_parser = name_list)]
    pub lease_queues: Vec<NameList>,
    /// Queues whose jobs all run in tx mode, whatever their handler declares (like --queues).
    #[arg(long, value_name = "Q,…", value_parser = name_list)]
    pub tx_queues: Vec<NameList>,
    /// Lease length of a lease-mode job (renewed every third of it).
    #[arg(long, value_parser = duration, default_value_t = human(config::LEASE_DURATION_DEFAULT))]
    pub lease_duration: HumanDuration,
    /// How often expired leases are moved back to the queue.
    #[arg(long, value_parser = duration, default_value_t = human(config::RESCUE_INTERVAL_DEFAULT))]
    pub rescue_interval: HumanDuration,
    /// How often the progress running jobs report is written (one statement for all of them).
    #[arg(long, value_parser = duration, default_value_t = human(config::PROGRESS_INTERVAL_DEFAULT))]
    pub progress_interval: HumanDuration,
    /// How often the worker looks for cancel requests of the jobs it runs (fallback for missed notifications).
    #[arg(long, value_parser = duration, default_value_t = human(config::CANCEL_POLL_INTERVAL_DEFAULT))]
    pub cancel_poll_interval: HumanDuration,
    /// Database sampling interval for queue and pressure gauges.
    #[arg(long, value_parser = duration, default_value_t = human(config::SAMPLE_INTERVAL_DEFAULT))]
    pub sample_interval: HumanDuration,
    /// application_name of the worker's connections.
    #[arg(long, env = "PGAPPNAME", default_value = config::APPLICATION_NAME_DEFAULT)]
    pub application_name: String,
    /// Address of /metrics, /health and /ready. Use 0.0.0.0:9187 to expose it.
    #[arg(long, default_value_t = config::METRICS_ADDR_DEFAULT)]
    pub metrics_addr: SocketAddr,
    /// Also serve the operator console (as `pgwake ui` does) on this address, e.g.
    /// 127.0.0.1:9190. Off by default.
    #[arg(long, value_name = "ADDR")]
    pub ui_addr: Option<SocketAddr>,
    /// With --ui-addr: allow the console's actions (needs PGWAKE_UI_TOKEN; see `pgwake ui`).
    #[arg(long, requires = "ui_addr")]
    pub ui_actions: bool,
    /// With --ui-addr: who may reach the console (see `pgwake ui`).
    #[command(flatten)]
    pub console: super::ui::ConsoleFlags,
    /// Keep finished jobs (done, dead, cancelled) and their results in pgwake.finished_jobs
    /// for at least this long (e.g. 7d; at least 1h), for every worker of the database;
    /// `off` turns history off. Default: leave the database's setting (off unless turned on).
    #[arg(long, value_parser = keep_finished)]
    pub keep_finished: Option<pgwake::config::KeepFinished>,
    /// How often the worker adds its counts of outcomes into the per-minute rollup
    /// (pgwake.minute_stats: `pgwake stats`, the console's charts); a worker killed with
    /// SIGKILL loses at most this much of its counts.
    #[arg(long, value_parser = duration, default_value_t = human(config::ROLLUP_FLUSH_INTERVAL_DEFAULT))]
    pub stats_flush_interval: HumanDuration,
    /// How long the per-minute rollup keeps a minute (at least 1h).
    #[arg(long, value_parser = duration, default_value_t = human(config::ROLLUP_RETENTION_DEFAULT))]
    pub stats_retention: HumanDuration,
    /// Do not count outcomes into the per-minute rollup on this worker.
    #[arg(long)]
    pub no_stats_rollup: bool,
    /// Most bytes of an exec command's stdout kept as its result (never written to the worker's
    /// stdout); 0 keeps none.
    #[arg(long, default_value_t = pgwake::handlers::exec::EXEC_STDOUT_MAX_DEFAULT, value_parser = exec_stdout_max)]
    pub exec_stdout_max: usize,
    /// Pass this variable of the worker's environment to exec commands unchanged, beside the
    /// few they inherit and PGWAKE_EXEC_<NAME> (passed as <NAME>). Repeatable; the environment
    /// form takes names separated by commas. DATABASE_URL and PG* names are refused.
    #[arg(
        long,
        value_name = "NAME",
        env = "PGWAKE_PASS_ENV",
        value_delimiter = ','
    )]
    pub exec_env: Vec<String>,
    /// Tasks whose jobs run in tx mode, whatever their handler declares (comma-separated,
    /// repeatable): a persistent or exec handler then runs inside the claim transaction, and a
    /// persistent handler may send SQL that commits with its job.
    #[arg(long, value_name = "TASK,…", value_parser = name_list)]
    pub tx_tasks: Vec<NameList>,
    /// Processes started per persistent handler command. Default: --concurrency.
    #[arg(long, value_name = "N")]
    pub processes: Option<usize>,
    /// Replace a persistent handler process after it served this many jobs (drained first).
    #[arg(long, value_name = "N")]
    pub max_jobs_per_process: Option<u64>,
    /// Replace a persistent handler process whose resident memory passes this many MiB
    /// (drained first).
    #[arg(long, value_name = "MIB")]
    pub max_process_memory: Option<u64>,
    /// Kill a persistent handler process that answers nothing (not even pings) this long.
    #[arg(long, value_parser = duration, default_value = "30s")]
    pub process_timeout: HumanDuration,
    /// A persistent handler process must say hello within this after it starts.
    #[arg(long, value_parser = duration, default_value = "60s")]
    pub process_start_timeout: HumanDuration,
    /// After a cancel or timeout, a persistent handler process must answer for the job within
    /// this, or it is killed (its other jobs run again, uncharged).
    #[arg(long, value_parser = duration, default_value = "10s")]
    pub cancel_grace: HumanDuration,
    /// Longest line, in bytes, a persistent handler process may write on its protocol
    /// descriptor.
    #[arg(long, value_name = "BYTES", default_value_t = pgwake::handlers::persistent::LINE_MAX_DEFAULT)]
    pub protocol_line_max: usize,
}

fn keep_finished(s: &str) -> Result<pgwake::config::KeepFinished, String> {
    pgwake::config::KeepFinished::parse(s)
}

fn exec_stdout_max(s: &str) -> Result<usize, String> {
    let max = pgwake::handlers::exec::EXEC_STDOUT_MAX_LIMIT;
    match s.parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("expected a number of bytes from 0 to {max}")),
    }
}

/// Since when `pgwake history` shows finished jobs.
#[derive(Debug, Clone, Copy)]
pub enum Since {
    /// This long before now (database clock).
    Ago(Duration),
    /// This moment.
    At(SystemTime),
}

fn since(s: &str) -> Result<Since, String> {
    if let Ok(d) = s.parse::<HumanDuration>() {
        return Ok(Since::Ago(d.into()));
    }
    super::timestamp::parse(s).map(Since::At).map_err(|_| {
        format!(
            "{s:?}: expected a duration (e.g. 1h, 7d) or {}",
            &super::timestamp::EXPECTED["expected ".len()..]
        )
    })
}

/// `pgwake history` flags.
#[derive(Args)]
pub struct HistoryArgs {
    #[command(flatten)]
    pub db: Db,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
    /// Only this task.
    #[arg(long)]
    pub task: Option<String>,
    /// Only this outcome.
    #[arg(long, value_parser = ["done", "dead", "cancelled"])]
    pub outcome: Option<String>,
    /// Only jobs finished since: a duration back from now (e.g. 1h) or an RFC 3339 timestamp.
    #[arg(long, value_parser = since)]
    pub since: Option<Since>,
    /// At most this many (1-1000).
    #[arg(long, default_value_t = pgwake::admin::history::LIST_LIMIT_DEFAULT, value_parser = clap::value_parser!(i64).range(1..=1000))]
    pub limit: i64,
    /// Only jobs after this one, newest first: the TIME/ID the previous page printed
    /// ("more: --after …").
    #[arg(long, value_name = "TIME/ID")]
    pub after: Option<pgwake::admin::history::After>,
    /// Print JSON (an array; payloads and results embedded as JSON).
    #[arg(long)]
    pub json: bool,
}

/// `pgwake enqueue` flags.
#[derive(Args)]
pub struct EnqueueArgs {
    #[command(flatten)]
    pub db: Db,
    /// Task name.
    #[arg(long, required_unless_present = "ndjson", conflicts_with = "ndjson", value_parser = task_name)]
    pub task: Option<String>,
    /// JSON payload.
    #[arg(long, default_value = "{}")]
    pub payload: String,
    /// Queue [default: default].
    #[arg(long, value_parser = queue_name)]
    pub queue: Option<String>,
    /// Run at: an RFC 3339 timestamp with a time zone, e.g. 2026-12-01T08:00:00Z
    /// [default: now].
    #[arg(long, conflicts_with = "delay", value_parser = super::timestamp::parse)]
    pub run_at: Option<SystemTime>,
    /// Run after this delay (e.g. 30s, 5m).
    #[arg(long, value_parser = duration)]
    pub delay: Option<HumanDuration>,
    /// Priority, lower runs first [default: 0].
    #[arg(long, allow_negative_numbers = true)]
    pub priority: Option<i32>,
    /// Attempts before the job is dead [default: 25].
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..), allow_negative_numbers = true)]
    pub max_attempts: Option<i32>,
    /// This job's timeout (e.g. 90s, 2h) [default: the worker's --job-timeout].
    #[arg(long, value_parser = duration)]
    pub timeout: Option<HumanDuration>,
    /// Ordering key: jobs with the same key run one at a time, in order.
    #[arg(long, conflicts_with = "ndjson")]
    pub ordering_key: Option<String>,
    /// Unique key: at most one waiting job per key; a duplicate is not
    /// enqueued, the waiting job's id is printed (and "duplicate" on stderr).
    #[arg(long, conflicts_with = "ndjson")]
    pub unique_key: Option<String>,
    /// With --unique-key: a running job with the key counts too (at most
    /// one waiting-or-running).
    #[arg(long, requires = "unique_key")]
    pub unique_running: bool,
    /// Limit key: who the job is for (a customer, a tenant), for the
    /// queue's per-key settings [default: the queue's --limit-key-path
    /// field of the payload].
    #[arg(long, conflicts_with = "ndjson")]
    pub limit_key: Option<String>,
    /// The W3C trace context of the request that enqueues the job, e.g.
    /// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01; with
    /// --ndjson, of every line without its own (a malformed one is ignored
    /// with a warning) [default: $TRACEPARENT].
    #[arg(long, env = "TRACEPARENT")]
    pub traceparent: Option<String>,
    /// With --traceparent: its tracestate [default: $TRACESTATE].
    #[arg(long, env = "TRACESTATE")]
    pub tracestate: Option<String>,
    /// A parent: the job waits until job ID has ended done (repeat it, or
    /// give a list: --after 41,42; at most 1,000).
    #[arg(
        long,
        value_name = "ID",
        value_delimiter = ',',
        conflicts_with = "ndjson"
    )]
    pub after: Vec<i64>,
    /// With --after: what the job does when a parent ends dead or
    /// cancelled: cancel, run or wait [default: cancel].
    #[arg(long, value_parser = ["cancel", "run", "wait"], requires = "after")]
    pub on_parent_failure: Option<String>,
    /// The batch the job belongs to (the id `pgwake batch open` printed): the batch's
    /// callback runs after this job has ended, whatever its outcome.
    #[arg(long, value_name = "ID", conflicts_with = "ndjson")]
    pub batch: Option<i64>,
    /// Read jobs from stdin, one JSON object per line:
    /// {"task": "...", "payload": {...}, "queue": "...", "run_at": "...", "priority": 0, "max_attempts": 25, "timeout": "90s", "ordering_key": "...", "unique_key": "...", "unique_running": false, "limit_key": "...", "traceparent": "...", "tracestate": "...", "after": [41, 42], "on_parent_failure": "cancel", "batch": 40}.
    /// All lines commit together or not at all.
    #[arg(long)]
    pub ndjson: bool,
}

/// `pgwake dead …` subcommands.
#[derive(Subcommand)]
pub enum DeadAction {
    /// List dead jobs, newest first.
    List {
        #[command(flatten)]
        db: Db,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = pgwake::admin::dead::LIST_LIMIT_DEFAULT, allow_negative_numbers = true)]
        limit: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move dead jobs back to the queue, attempts reset.
    Retry {
        #[command(flatten)]
        db: Db,
        #[command(flatten)]
        sel: SelectArgs,
        /// With --all: also retry the jobs an operator cancelled (left
        /// alone otherwise; an --id names its job whatever its state).
        #[arg(long, requires = "all")]
        include_cancelled: bool,
    },
    /// Delete dead jobs for good.
    Purge {
        #[command(flatten)]
        db: Db,
        #[command(flatten)]
        sel: SelectArgs,
        /// Only jobs that died longer ago than this (e.g. 7d).
        #[arg(long, value_parser = duration)]
        older_than: Option<HumanDuration>,
    },
}

/// Which dead jobs a retry or purge acts on.
#[derive(Args)]
pub struct SelectArgs {
    /// Job ids, as `pgwake job show` takes them (`pgwake dead retry 41 42`).
    #[arg(value_name = "ID", allow_negative_numbers = true)]
    pub positional: Vec<i64>,
    /// Job id (repeatable).
    #[arg(long = "id", allow_negative_numbers = true)]
    pub ids: Vec<i64>,
    /// Every dead job (of --queue, if given).
    #[arg(long, conflicts_with_all = ["ids", "positional"])]
    pub all: bool,
    /// Only this queue.
    #[arg(long)]
    pub queue: Option<String>,
}

impl SelectArgs {
    /// The library's selection.
    pub fn selection(&self) -> pgwake::admin::dead::Selection {
        let ids: Vec<i64> = self.positional.iter().chain(&self.ids).copied().collect();
        pgwake::admin::dead::Selection {
            ids: (!ids.is_empty()).then_some(ids),
            queue: self.queue.clone(),
            all: self.all,
        }
    }
}
