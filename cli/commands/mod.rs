//! The `pgwake` command line, one module per concern: [`args`] (flags),
//! [`logging`], [`explain`] (error messages and exit codes), [`run`] (the
//! worker's wiring), [`enqueue`] and [`ndjson`] (producing), [`dead`] (dead
//! jobs), [`doctor`] (what breaks queues, with fixes), [`schedule`] (recurring jobs), [`cancel`] (cancelling jobs),
//! [`queue`] (queue settings), [`pressure`] (the database pressure), [`protocol`] (the persistent
//! handler protocol's conformance check), [`history`] (finished jobs), [`ui`] (the console), [`shell`]
//! (quoting the names in the commands it suggests), and here the dispatch and
//! the small commands.

pub mod args;
pub mod batch;
pub mod cancel;
pub mod database;
pub mod dead;
pub mod doctor;
pub mod enqueue;
pub mod explain;
pub mod history;
pub mod jobs;
pub mod logging;
pub mod ndjson;
pub mod otel;
pub mod pressure;
pub mod protocol;
pub mod queue;
pub mod run;
pub mod schedule;
pub mod shell;
pub mod signal;
pub mod timestamp;
pub mod ui;

use std::process::ExitCode;

use pgwake::error::Error;
use pgwake::{admin::schema, admin::stats, connect};

use args::{Command, Db};

/// The log level when `RUST_LOG` is unset.
pub fn default_log_level(command: &Command) -> &'static str {
    match command {
        // The demo prints every outcome itself; its logs would repeat them.
        Command::Demo(_) => "error",
        // The bench starts dozens of in-process workers; their start/stop
        // lines would bury its progress.
        Command::Bench(_) => "warn",
        // What the candidate prints would bury the check's lines
        // (RUST_LOG=pgwake::persistent=info shows it).
        Command::Protocol { .. } => "warn",
        // The report is the output; a pool's info lines would interleave.
        Command::Doctor(_) => "warn",
        _ => "info",
    }
}

/// Run one command; its exit code (most commands: success, or `Err`, whose
/// code [`explain::exit_code`] gives; `pgwake doctor` says its own).
pub async fn dispatch(command: Command) -> Result<ExitCode, Error> {
    let done = match command {
        Command::Doctor(args) => return Ok(doctor::command(args).await),
        Command::Run(args) => run::run(*args).await,
        Command::Migrate(db) => migrate(db).await,
        Command::Enqueue(args) => enqueue::enqueue(args).await,
        Command::Stats { db, json, since } => print_stats(db, json, since.into()).await,
        Command::Dead { action } => dead::command(action).await,
        Command::History(args) => history::command(args).await,
        Command::Schedule { action } => schedule::command(action).await,
        Command::Cancel(args) => cancel::command(args).await,
        Command::Signal(args) => signal::command(args).await,
        Command::Batch { action } => batch::command(action).await,
        Command::Queue { action } => queue::command(action).await,
        Command::Pressure { action } => pressure::command(action).await,
        Command::Jobs { action } => jobs::jobs_command(action).await,
        Command::Job { action } => jobs::job_command(action).await,
        Command::Explain(args) => jobs::explain_command(args).await,
        Command::Ui(args) => ui::command(args).await,
        Command::Protocol { action } => protocol::command(action).await,
        Command::Bench(args) => crate::bench::run(args).await,
        Command::Demo(args) => {
            crate::demo::run(crate::demo::DemoOptions {
                database_url: args.database_url,
                metrics_addr: args.metrics_addr,
                ui_addr: args.ui_addr,
                console: args.console,
            })
            .await
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

async fn migrate(db: Db) -> Result<(), Error> {
    let mut client = connect::connect(&db.config()?).await?;
    let report = schema::migrate(&mut client).await?;
    if report.unchanged() {
        println!(
            "schema is current (version {}); nothing changed",
            report.version
        );
    } else {
        if !report.applied.is_empty() {
            let versions: Vec<String> = report.applied.iter().map(i32::to_string).collect();
            println!("applied migrations {}", versions.join(", "));
        }
        if !report.definitions.is_empty() {
            println!("applied definitions {}", report.definitions.join(", "));
        }
        if !report.revoked_public.is_empty() {
            println!(
                "revoked EXECUTE from PUBLIC on {} functions of the schema (roles get theirs from pgwake.grant_producer|worker|monitor)",
                report.revoked_public.len()
            );
        }
        if !report.grants.is_empty() {
            let roles: Vec<String> = report
                .grants
                .iter()
                .map(|g| format!("{} ({})", g.role, g.kind))
                .collect();
            println!("re-applied the grants of {}", roles.join(", "));
        }
        println!("schema at version {}", report.version);
    }
    Ok(())
}

async fn print_stats(db: Db, json: bool, since: std::time::Duration) -> Result<(), Error> {
    stats::check_window(since)?;
    let config = db.config()?;
    let client = connect::connect(&config).await?;
    schema::check(&client).await?;
    let pool = connect::pool(&config, 1)?;
    let s = stats::read_since(&pool, since).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
    } else {
        print!("{}", stats::render_table(&s));
    }
    Ok(())
}
