//! The `pgwake` command line.

use std::io::BufRead;
use std::net::SocketAddr;
use std::process::ExitCode;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use pgwake::client::{enqueue_many, NewJob};
use pgwake::error::{Error, PgDisplay};
use pgwake::{connect, dead, schema, stats, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

/// A PostgreSQL job-queue worker: insert trigger → LISTEN → SKIP LOCKED
/// claims → handlers, with Prometheus metrics.
#[derive(Parser)]
#[command(name = "pgwake", version, about, long_about = None)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Db {
    /// PostgreSQL URL, e.g. postgres://user:pass@host:5432/db.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
}

impl Db {
    fn config(&self) -> Result<tokio_postgres::Config, Error> {
        let url = self.database_url.as_deref().ok_or_else(|| {
            Error::Config(
                "no database: set DATABASE_URL or pass --database-url postgres://USER@HOST/DB"
                    .into(),
            )
        })?;
        connect::parse_url(url)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run the worker.
    Run(RunArgs),
    /// Create or upgrade the pgwake schema (safe to run concurrently).
    Migrate(Db),
    /// Enqueue a job, or many from NDJSON on stdin.
    Enqueue(EnqueueArgs),
    /// Per-queue depth, dead count and oldest ready age.
    Stats {
        #[command(flatten)]
        db: Db,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Inspect, retry and purge dead jobs.
    Dead {
        #[command(subcommand)]
        action: DeadAction,
    },
    /// Measure throughput, pickup latency and producer cost against the raw-SQL ceiling.
    Bench(pgwake::bench::BenchArgs),
    /// Run a demo on a throwaway PostgreSQL (or --database-url).
    Demo {
        /// Use this database instead of a throwaway cluster.
        #[arg(long)]
        database_url: Option<String>,
        /// Where to serve metrics.
        #[arg(long, default_value = "127.0.0.1:9187")]
        metrics_addr: SocketAddr,
        /// Keep running after every job is resolved, until Ctrl-C.
        #[arg(long)]
        keep_running: bool,
    },
}

fn duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 2s, 1m)"))
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    db: Db,
    /// LISTEN through this database URL instead of DATABASE_URL, e.g. when
    /// claims go through PgBouncer in transaction mode (which cannot LISTEN).
    #[arg(long, env = "PGWAKE_LISTEN_DATABASE_URL", hide_env_values = true)]
    listen_database_url: Option<String>,
    /// Handler per task: TASK=exec:COMMAND [ARGS] or TASK=sql:FUNCTION; `*` matches every task. Repeatable.
    #[arg(long = "handler", value_name = "TASK=KIND:SPEC", required = true)]
    handlers: Vec<String>,
    /// Queues to work, comma-separated (default: all).
    #[arg(long, value_delimiter = ',')]
    queues: Option<Vec<String>>,
    /// Claim tasks = jobs in flight at once.
    #[arg(long, default_value_t = pgwake::config::CONCURRENCY_DEFAULT)]
    concurrency: usize,
    /// Jobs per claim (run one after another in one transaction; use 1 for slow jobs).
    #[arg(long, default_value_t = pgwake::config::BATCH_DEFAULT)]
    batch: usize,
    /// Fallback poll interval (jittered ±25%).
    #[arg(long, value_parser = duration, default_value = "2s")]
    poll_interval: Duration,
    /// Poll only; no LISTEN (e.g. behind PgBouncer in transaction mode).
    #[arg(long)]
    no_listen: bool,
    /// Per-job timeout; a job running longer fails its attempt.
    #[arg(long, value_parser = duration, default_value = "60s")]
    job_timeout: Duration,
    /// First retry delay (doubles per attempt, equal jitter).
    #[arg(long, value_parser = duration, default_value = "1s")]
    retry_base: Duration,
    /// Retry delay cap.
    #[arg(long, value_parser = duration, default_value = "1h")]
    retry_max: Duration,
    /// Time in-flight jobs get to finish after SIGTERM/SIGINT.
    #[arg(long, value_parser = duration, default_value = "20s")]
    grace_period: Duration,
    /// Queues whose jobs run in lease mode (long jobs; no transaction held), comma-separated.
    /// Every worker that can claim them must list them.
    #[arg(long, value_delimiter = ',')]
    lease_queues: Vec<String>,
    /// Lease length of a lease-mode job (renewed every third of it).
    #[arg(long, value_parser = duration, default_value = "30s")]
    lease_duration: Duration,
    /// Timeout of a lease-mode job.
    #[arg(long, value_parser = duration, default_value = "1h")]
    lease_job_timeout: Duration,
    /// How often expired leases are moved back to the queue.
    #[arg(long, value_parser = duration, default_value = "5s")]
    rescue_interval: Duration,
    /// Database sampling interval for queue and pressure gauges.
    #[arg(long, value_parser = duration, default_value = "5s")]
    sample_interval: Duration,
    /// application_name of the worker's connections.
    #[arg(long, default_value = "pgwake")]
    application_name: String,
    /// Address of /metrics, /health and /ready. Use 0.0.0.0:9187 to expose it.
    #[arg(long, default_value = "127.0.0.1:9187")]
    metrics_addr: SocketAddr,
}

#[derive(Args)]
struct EnqueueArgs {
    #[command(flatten)]
    db: Db,
    /// Task name.
    #[arg(long, required_unless_present = "ndjson", conflicts_with = "ndjson")]
    task: Option<String>,
    /// JSON payload.
    #[arg(long, default_value = "{}")]
    payload: String,
    /// Queue.
    #[arg(long)]
    queue: Option<String>,
    /// Run at (a timestamp, e.g. 2026-12-01T08:00:00Z).
    #[arg(long, conflicts_with = "delay")]
    run_at: Option<String>,
    /// Run after this delay (e.g. 30s, 5m).
    #[arg(long, value_parser = duration)]
    delay: Option<Duration>,
    /// Priority (lower runs first).
    #[arg(long)]
    priority: Option<i32>,
    /// Attempts before the job is dead.
    #[arg(long)]
    max_attempts: Option<i32>,
    /// Read jobs from stdin, one JSON object per line:
    /// {"task": "...", "payload": {...}, "queue": "...", "run_at": "...", "priority": 0, "max_attempts": 25}.
    /// All lines commit together or not at all.
    #[arg(long)]
    ndjson: bool,
}

#[derive(Subcommand)]
enum DeadAction {
    /// List dead jobs, newest first.
    List {
        #[command(flatten)]
        db: Db,
        /// Only this queue.
        #[arg(long)]
        queue: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
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
    },
    /// Delete dead jobs for good.
    Purge {
        #[command(flatten)]
        db: Db,
        #[command(flatten)]
        sel: SelectArgs,
        /// Only jobs that died longer ago than this (e.g. 7d).
        #[arg(long, value_parser = duration)]
        older_than: Option<Duration>,
    },
}

#[derive(Args)]
struct SelectArgs {
    /// Job id (repeatable).
    #[arg(long = "id")]
    ids: Vec<i64>,
    /// Every dead job (of --queue, if given).
    #[arg(long, conflicts_with = "ids")]
    all: bool,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
}

impl SelectArgs {
    fn selection(&self) -> dead::Selection {
        dead::Selection {
            ids: (!self.ids.is_empty()).then(|| self.ids.clone()),
            queue: self.queue.clone(),
            all: self.all,
        }
    }
}

fn init_logging(format: &str, default_level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// One line for a person: what failed and what to do. Never the URL.
fn explain(e: &Error) -> String {
    match e {
        Error::Db { context, source }
        | Error::Pool {
            context,
            source: deadpool_postgres::PoolError::Backend(source),
        } => {
            let hint = if source.as_db_error().is_none() {
                "; check DATABASE_URL (host, port) and that the server is running"
            } else if source.code().map(|c| c.code()) == Some("28P01")
                || source.code().map(|c| c.code()) == Some("28000")
            {
                "; check the user and password in DATABASE_URL"
            } else if source.code().map(|c| c.code()) == Some("3D000") {
                "; create the database or fix its name in DATABASE_URL"
            } else {
                ""
            };
            format!("{context}: {}{hint}", PgDisplay(source))
        }
        other => other.to_string(),
    }
}

fn exit_code(e: &Error) -> ExitCode {
    match e {
        Error::Config(_) | Error::DatabaseUrl(_) => ExitCode::from(2),
        _ => ExitCode::from(1),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo prints every outcome itself; its logs would repeat them.
    let level = match cli.command {
        Command::Demo { .. } => "error",
        // The bench starts dozens of in-process workers; their start/stop
        // lines would bury its progress.
        Command::Bench(_) => "warn",
        _ => "info",
    };
    init_logging(&cli.log_format, level);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pgwake: error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(dispatch(cli.command));
    // A handler that ignores cancellation must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pgwake: error: {}", explain(&e));
            exit_code(&e)
        }
    }
}

async fn dispatch(command: Command) -> Result<(), Error> {
    match command {
        Command::Run(args) => run(args).await,
        Command::Migrate(db) => {
            let mut client = connect::connect(&db.config()?).await?;
            let report = schema::migrate(&mut client).await?;
            if report.applied.is_empty() {
                println!(
                    "schema is current (version {}); triggers re-applied",
                    report.version
                );
            } else {
                println!(
                    "applied migrations {:?}; schema at version {}",
                    report.applied, report.version
                );
            }
            Ok(())
        }
        Command::Enqueue(args) => enqueue(args).await,
        Command::Stats { db, json } => {
            let config = db.config()?;
            let client = connect::connect(&config).await?;
            schema::check(&client).await?;
            let pool = connect::pool(&config, 1)?;
            let s = stats::read(&pool).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            } else {
                print!("{}", stats::render_table(&s));
            }
            Ok(())
        }
        Command::Dead { action } => dead_command(action).await,
        Command::Bench(args) => pgwake::bench::run(args).await,
        Command::Demo {
            database_url,
            metrics_addr,
            keep_running,
        } => {
            pgwake::demo::run(pgwake::demo::DemoOptions {
                database_url,
                metrics_addr,
                keep_running,
            })
            .await
        }
    }
}

async fn run(args: RunArgs) -> Result<(), Error> {
    let config = WorkerConfig {
        queues: args.queues,
        concurrency: args.concurrency,
        batch: args.batch,
        poll_interval: args.poll_interval,
        listen: !args.no_listen,
        job_timeout: args.job_timeout,
        retry_base: args.retry_base,
        retry_max: args.retry_max,
        grace_period: args.grace_period,
        sample_interval: Some(args.sample_interval),
        application_name: args.application_name,
        lease_queues: args.lease_queues,
        lease_duration: args.lease_duration,
        lease_job_timeout: args.lease_job_timeout,
        rescue_interval: args.rescue_interval,
        ..WorkerConfig::default()
    };
    config.validate()?;
    let db = args.db.config()?;
    let mut builder = Worker::builder(db).config(config);
    if let Some(url) = &args.listen_database_url {
        builder = builder.listen_database(connect::parse_url(url)?);
    }
    for flag in &args.handlers {
        let (task, handler) = pgwake::handlers::parse_flag(flag)?;
        builder = builder.handler_arc(&task, handler);
    }
    let worker = builder.build()?;
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let handle = pgwake::metrics::install();
    let (addr, http) =
        pgwake::endpoint::serve(args.metrics_addr, handle, worker.health(), abort.clone()).await?;
    tracing::info!(%addr, "serving /metrics, /health, /ready");
    pgwake::signals::spawn(stop.clone(), abort.clone(), worker.config().grace_period)?;
    let result = worker.run(stop, abort.clone()).await;
    abort.cancel();
    let _ = http.await;
    result
}

async fn enqueue(args: EnqueueArgs) -> Result<(), Error> {
    let jobs = if args.ndjson {
        read_ndjson(std::io::stdin().lock())?
    } else {
        let payload: serde_json::Value = serde_json::from_str(&args.payload)
            .map_err(|e| Error::Config(format!("--payload is not valid JSON: {e}")))?;
        let mut job = NewJob::new(args.task.unwrap_or_default(), payload);
        job.queue = args.queue;
        job.run_at = match (args.run_at, args.delay) {
            (Some(at), _) => Some(at),
            (None, Some(d)) => {
                Some(humantime::format_rfc3339_micros(std::time::SystemTime::now() + d).to_string())
            }
            (None, None) => None,
        };
        job.priority = args.priority;
        job.max_attempts = args.max_attempts;
        vec![job]
    };
    if jobs.is_empty() {
        return Err(Error::Config("no jobs on stdin".into()));
    }
    let mut client = connect::connect(&args.db.config()?).await?;
    schema::check(&client).await?;
    let tx = client
        .transaction()
        .await
        .map_err(Error::db("enqueue: begin"))?;
    let mut ids = Vec::with_capacity(jobs.len());
    for (n, chunk) in jobs.chunks(NDJSON_BATCH).enumerate() {
        let first = n * NDJSON_BATCH + 1;
        let chunk_ids = enqueue_many(&tx, chunk)
            .await
            .map_err(|e| e.at(format_args!("jobs {first}–{}", first + chunk.len() - 1)))?;
        ids.extend(chunk_ids);
    }
    tx.commit().await.map_err(Error::db("enqueue: commit"))?;
    if ids.len() == 1 {
        println!("{}", ids[0]);
    } else {
        println!(
            "enqueued {} jobs (ids {}–{})",
            ids.len(),
            ids[0],
            ids[ids.len() - 1]
        );
    }
    Ok(())
}

/// Rows per INSERT statement for `enqueue --ndjson`.
const NDJSON_BATCH: usize = 5000;

fn read_ndjson(input: impl BufRead) -> Result<Vec<NewJob>, Error> {
    let mut jobs = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|source| Error::Io {
            context: "reading stdin".into(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let job: NewJob = serde_json::from_str(&line)
            .map_err(|e| Error::Config(format!("stdin line {}: {e}", i + 1)))?;
        job.validate()
            .map_err(|e| e.at(format_args!("stdin line {}", i + 1)))?;
        jobs.push(job);
    }
    Ok(jobs)
}

async fn dead_command(action: DeadAction) -> Result<(), Error> {
    match action {
        DeadAction::List {
            db,
            queue,
            limit,
            json,
        } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let rows = dead::list(&client, queue.as_deref(), limit).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&rows).unwrap_or_default()
                );
            } else if rows.is_empty() {
                println!("no dead jobs");
            } else {
                for r in rows {
                    println!(
                        "{:>8}  {:<12} {:<20} attempts {}/{}  died {}  {}",
                        r.id,
                        r.queue,
                        r.task,
                        r.attempts,
                        r.max_attempts,
                        r.failed_at,
                        r.last_error.unwrap_or_default()
                    );
                }
            }
            Ok(())
        }
        DeadAction::Retry { db, sel } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let ids = dead::retry(&client, &sel.selection()).await?;
            println!("moved {} dead jobs back to the queue", ids.len());
            Ok(())
        }
        DeadAction::Purge {
            db,
            sel,
            older_than,
        } => {
            let client = connect::connect(&db.config()?).await?;
            schema::check(&client).await?;
            let n = dead::purge(&client, &sel.selection(), older_than).await?;
            println!("purged {n} dead jobs");
            Ok(())
        }
    }
}
