//! `pgwake-exec-shim`: started by the `exec` handler in front of each
//! command (`pgwake-exec-shim __exec-shim PPID PROGRAM ARGS…`), it sets the
//! death signal and becomes the command. A binary of its own, and a small
//! one: it is `exec`ed once per job, and the `pgwake` binary's start-up
//! alone (49,000 relocations) costs more than the fork it saves. See
//! `pgwake::handlers::exec::run_if_asked`.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(pgwake::handlers::exec::run_if_asked().unwrap_or_else(|| {
        eprintln!(
            "pgwake-exec-shim: started by pgwake's exec handler, not by hand ({} PPID PROGRAM [ARGS…])",
            pgwake::handlers::exec::EXEC_SHIM_ARG
        );
        pgwake::handlers::exec::EXIT_CANNOT_START
    }))
}
