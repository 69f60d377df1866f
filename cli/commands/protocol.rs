//! `pgwake protocol check COMMAND [ARGS…]`: the persistent handler
//! protocol's conformance check, on top of
//! [`pgwake::handlers::persistent::check`].

use clap::{Args, Subcommand};
use pgwake::error::Error;
use pgwake::handlers::persistent::check;

use super::args::{duration, HumanDuration};

/// `pgwake protocol` subcommands.
#[derive(Subcommand)]
pub enum ProtocolAction {
    /// Drive a persistent handler (COMMAND [ARGS…], started as `pgwake run` starts it) through
    /// protocol 1 with the demo tasks echo, sleep and crash: handshake, credits, ping, cancel, a
    /// stale token, an oversize line, drain and a crash. One line per check; exits 0 when all
    /// pass, 1 when any fails, 2 when COMMAND is not found.
    Check(CheckArgs),
}

/// `pgwake protocol check` flags.
#[derive(Args)]
pub struct CheckArgs {
    /// The candidate must say hello within this after it starts.
    #[arg(long, value_parser = duration, default_value = "60s")]
    process_start_timeout: HumanDuration,
    /// Each job's answer, and each pong, must come within this.
    #[arg(long, value_parser = duration, default_value = "10s")]
    reply_timeout: HumanDuration,
    /// A cancelled job must be answered within this (`pgwake run` kills the process after
    /// --cancel-grace, 10s by default).
    #[arg(long, value_parser = duration, default_value = "5s")]
    cancel_within: HumanDuration,
    /// Longest line, in bytes, the candidate may write.
    #[arg(long, value_name = "BYTES", default_value_t = pgwake::handlers::persistent::LINE_MAX_DEFAULT)]
    protocol_line_max: usize,
    /// Names of environment variables passed to the candidate, as `pgwake run --exec-env`.
    #[arg(long, value_name = "NAME", value_delimiter = ',')]
    exec_env: Vec<String>,
    /// The candidate: a program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "COMMAND"
    )]
    command: Vec<String>,
}

/// Run the check and print one line per check; `Err` (exit 1) when any
/// failed.
pub async fn command(action: ProtocolAction) -> Result<(), Error> {
    let ProtocolAction::Check(args) = action;
    let mut opts = check::Options::default();
    opts.start_timeout = args.process_start_timeout.into();
    opts.reply_timeout = args.reply_timeout.into();
    opts.cancel_within = args.cancel_within.into();
    opts.line_max = args.protocol_line_max;
    opts.passed_env = args.exec_env;
    let report = check::run(&args.command, &opts).await?;
    for c in &report.checks {
        println!("{c}");
    }
    if report.passed() {
        println!("all {} checks passed", report.checks.len());
        return Ok(());
    }
    let failed = report.failed();
    Err(Error::Refused(format!(
        "{} of {} checks did not pass ({}): the command does not follow protocol {}",
        failed.len(),
        report.checks.len(),
        failed.join(", "),
        pgwake::handlers::persistent::PROTOCOL_VERSION
    )))
}
