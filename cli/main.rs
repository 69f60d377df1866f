//! The `pgwake` command line. The library (`pgwake::…`) is the worker, the
//! producer and the admin API; this binary adds the flags ([`commands`]), the
//! demo ([`demo`]), the benchmark ([`bench`]) and the throwaway PostgreSQL
//! clusters they start ([`embedded`]).

mod bench;
mod commands;
mod demo;
mod embedded;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// A line on stderr; never a panic when stderr is a broken pipe (the exit
/// code must still say what happened).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn main() -> ExitCode {
    // Exec commands are spawned through `pgwake-exec-shim` beside this
    // binary (with `posix_spawn`); without it, by a fork of the worker.
    if let Some(shim) = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(pgwake::handlers::exec::EXEC_SHIM_BINARY)))
        .filter(|shim| shim.is_file())
    {
        pgwake::handlers::exec::use_exec_shim(shim);
    }
    let cli = match commands::args::Cli::try_parse() {
        Ok(cli) => cli,
        // `pgwake doctor`'s 2 means "a problem was found": its usage errors
        // exit 3 ("could not check"), like its connection errors.
        Err(e)
            if e.use_stderr()
                && commands::doctor::is_doctor(&std::env::args().collect::<Vec<_>>()) =>
        {
            let _ = e.print();
            return ExitCode::from(commands::doctor::EXIT_UNKNOWN);
        }
        Err(e) => e.exit(),
    };
    let mut cli = cli;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            say(&format!(
                "pgwake: error: cannot start the async runtime: {e}"
            ));
            return ExitCode::from(1);
        }
    };
    // Spans are exported by `pgwake run` alone, when an OTLP endpoint is
    // set; the exporter's task and clients need the runtime.
    let exporter = {
        let _in_runtime = runtime.enter();
        match commands::otel::exporter(&mut cli.command) {
            Ok(e) => e,
            Err(e) => {
                say(&format!(
                    "pgwake: error: {}",
                    commands::explain::explain(&e)
                ));
                return commands::explain::exit_code(&e);
            }
        }
    };
    commands::logging::init(
        &cli.log_format,
        commands::default_log_level(&cli.command),
        exporter.as_ref(),
    );
    let result = runtime.block_on(commands::dispatch(cli.command));
    if let Some(exporter) = exporter {
        // What the last jobs' spans left in the queue.
        runtime.block_on(exporter.shutdown());
    }
    // A handler that ignores cancellation must not keep the process alive.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(code) => code,
        Err(e) => {
            say(&format!(
                "pgwake: error: {}",
                commands::explain::explain(&e)
            ));
            commands::explain::exit_code(&e)
        }
    }
}
