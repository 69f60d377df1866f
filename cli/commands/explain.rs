//! What the command line prints when a command fails, and its exit code.

use std::process::ExitCode;

use pgwake::error::Error;

/// One line for a person: what failed and what to do. Never the URL.
pub fn explain(e: &Error) -> String {
    let hint = if e.is_unreachable() {
        "; check DATABASE_URL (host, port) and that the server is running"
    } else if e.is_auth_failure() {
        "; check the user and password in DATABASE_URL"
    } else if e.is_unknown_database() {
        "; create the database or fix its name in DATABASE_URL"
    } else {
        ""
    };
    format!("{e}{hint}")
}

/// 2 for invalid configuration or input (the message names the flag or
/// line), 1 for everything else.
pub fn exit_code(e: &Error) -> ExitCode {
    if e.is_usage() {
        ExitCode::from(2)
    } else {
        ExitCode::from(1)
    }
}
