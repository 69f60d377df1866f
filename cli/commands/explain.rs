//! What the command line prints when a command fails, and its exit code.

use std::process::ExitCode;

use pgwake::error::Error;

/// One line for a person: what failed and what to do. Never the URL.
pub fn explain(e: &Error) -> String {
    let settings = settings_source();
    let hint = if e.is_unreachable() {
        format!("; check the host and port ({settings}) and that the server is running")
    } else if e.is_refused_by_hba() {
        "; the server's pg_hba.conf has no entry for this connection: if it accepts only TLS (hostssl lines), set sslmode=require or verify-full (URL or PGSSLMODE); else it needs an entry for this user, database and address".to_string()
    } else if e.is_auth_failure() {
        format!("; check the user and password ({settings}, or the password file)")
    } else if e.is_unknown_database() {
        format!("; create the database or fix its name ({settings})")
    } else {
        String::new()
    };
    format!("{e}{hint}")
}

/// Where the connection settings came from, for hints: the URL given
/// (`--database-url` or `DATABASE_URL`), else the libpq variables.
fn settings_source() -> &'static str {
    let flag = std::env::args().any(|a| a.starts_with("--database-url"));
    if flag {
        "--database-url"
    } else if std::env::var_os("DATABASE_URL").is_some_and(|v| !v.is_empty()) {
        "DATABASE_URL"
    } else {
        "the PG* variables: PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE"
    }
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
