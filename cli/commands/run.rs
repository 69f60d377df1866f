//! `pgwake run`: flags → [`WorkerConfig`], handlers, the metrics endpoint,
//! signal handling, and the worker.

use std::collections::HashMap;
use std::sync::Arc;

use pgwake::error::Error;
use pgwake::Handler;
use pgwake::{connect, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

use super::args::{names, RunArgs};

/// The worker's settings from the flags, validated.
pub fn worker_config(args: &RunArgs) -> Result<WorkerConfig, Error> {
    let config = WorkerConfig {
        queues: args.queues.as_deref().map(names),
        concurrency: args.concurrency,
        max_connections: args.max_connections,
        prefetch: args.prefetch,
        prefetch_wait: args.prefetch_wait.into(),
        batch: args.batch,
        claim_pace: args.claim_pace.into(),
        poll_interval: args.poll_interval.into(),
        listen: !args.no_listen,
        job_timeout: args.job_timeout.into(),
        retry_base: args.retry_base.into(),
        retry_max: args.retry_max.into(),
        grace_period: args.grace_period.into(),
        sample_interval: Some(args.sample_interval.into()),
        application_name: args.application_name.clone(),
        lease_queues: names(&args.lease_queues),
        lease_duration: args.lease_duration.into(),
        tx_queues: names(&args.tx_queues),
        rescue_interval: args.rescue_interval.into(),
        progress_interval: args.progress_interval.into(),
        prepared_statements: args.prepared_statements,
        fail_fast: args.fail_fast,
        trace_jobs: args.trace_jobs,
        history: pgwake::config::HistoryConfig::keeping(args.keep_finished.unwrap_or_default()),
        cancel_poll_interval: args.cancel_poll_interval.into(),
        rollup: (!args.no_stats_rollup).then(|| pgwake::config::RollupConfig {
            flush_interval: args.stats_flush_interval.into(),
            retention: args.stats_retention.into(),
        }),
        ..WorkerConfig::default()
    };
    config.validate()?;
    Ok(config)
}

/// Bind `--metrics-addr` (before any start-up work, so that a taken port
/// is the first thing the user hears about).
pub async fn bind_metrics(addr: std::net::SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    pgwake::endpoint::bind(addr).await.map_err(|e| {
        let why = match &e {
            Error::Io { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        Error::Config(format!(
            "--metrics-addr {addr}: cannot listen ({why}); is another pgwake or demo running? \
             Pick another port, e.g. --metrics-addr 127.0.0.1:0 for any free one"
        ))
    })
}

/// A task name and its handler.
type TaskHandler = (String, Arc<dyn Handler>);

/// The handlers of the `--handler` flags; a task given twice is refused
/// (silently keeping the last would run a handler the user did not mean).
fn handlers(args: &RunArgs) -> Result<Vec<TaskHandler>, Error> {
    // Refused even without an exec handler: a worker is never to be started with them.
    pgwake::handlers::exec::check_passed_env(&args.exec_env)?;
    let persistent = pgwake::handlers::persistent::Options {
        processes: args.processes.unwrap_or(args.concurrency),
        max_jobs_per_process: args.max_jobs_per_process,
        max_memory: args
            .max_process_memory
            .map(|mib| mib.saturating_mul(1024 * 1024)),
        process_timeout: args.process_timeout.into(),
        start_timeout: args.process_start_timeout.into(),
        cancel_grace: args.cancel_grace.into(),
        line_max: args.protocol_line_max,
        passed_env: args.exec_env.clone(),
        ..Default::default()
    };
    let mut parser =
        pgwake::handlers::Parser::new(args.exec_stdout_max, &args.exec_env, persistent);
    let tx_tasks = names(&args.tx_tasks);
    let mut seen: HashMap<String, &str> = HashMap::new();
    let mut out = Vec::with_capacity(args.handlers.len());
    for flag in &args.handlers {
        let (task, handler) = parser.parse(flag)?;
        let handler = if tx_tasks.contains(&task) {
            pgwake::handlers::with_delivery(handler, pgwake::Delivery::Tx)
        } else {
            handler
        };
        if let Some(first) = seen.insert(task.clone(), flag) {
            return Err(Error::Config(format!(
                "--handler {flag:?}: task {task:?} already has a handler (--handler {first:?}); \
                 give each task one --handler"
            )));
        }
        out.push((task, handler));
    }
    if let Some(task) = tx_tasks.iter().find(|t| !seen.contains_key(*t)) {
        return Err(Error::Config(format!(
            "--tx-tasks {task:?}: no --handler for this task; give it one, or remove it from --tx-tasks"
        )));
    }
    let execs = args.handlers.iter().any(|f| {
        f.split_once('=')
            .is_some_and(|(_, spec)| spec.starts_with("exec:"))
    });
    if execs && pgwake::handlers::exec::exec_shim().is_none() {
        tracing::info!(
            "{} is not beside the pgwake binary: exec commands are started by forking the worker (slower)",
            pgwake::handlers::exec::EXEC_SHIM_BINARY
        );
    }
    Ok(out)
}

/// Run the worker until SIGTERM/SIGINT/SIGHUP.
pub async fn run(args: RunArgs) -> Result<(), Error> {
    let config = worker_config(&args)?;
    let handlers = handlers(&args)?;
    let metrics_listener = bind_metrics(args.metrics_addr).await?;
    let console =
        match args.ui_addr {
            Some(addr) => Some(super::ui::prepare(addr, args.ui_actions, &args.console).await?),
            None if args.console.any() => return Err(Error::Config(
                "--ui-host, --ui-open-reads, --ui-secure-cookie and --ui-trace-link need --ui-addr"
                    .into(),
            )),
            None => None,
        };
    let db = args.db.config()?;
    let console_db = db.clone();
    let mut builder = Worker::builder(db).config(config);
    if let Some(url) = &args.listen_database_url {
        builder = builder.listen_database(connect::parse_url(url)?);
    }
    for (task, handler) in handlers {
        builder = builder.handler_arc(&task, handler);
    }
    let worker = builder.build()?;
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    let handle = pgwake::metrics::install();
    let (addr, http) =
        pgwake::endpoint::serve_on(metrics_listener, handle, worker.health(), abort.clone())?;
    tracing::info!(%addr, "serving /metrics, /health, /ready");
    let console = match console {
        Some((listener, ui)) => Some(super::ui::start(listener, ui, &console_db, abort.clone())?.1),
        None => None,
    };
    pgwake::signals::spawn(stop.clone(), abort.clone(), worker.config().grace_period)?;
    let result = worker.run(stop, abort.clone()).await;
    abort.cancel();
    let _ = http.await;
    if let Some(console) = console {
        let _ = console.await;
    }
    result
}
