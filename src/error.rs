//! The error type of pgwake's boundaries: configuration, the database, and
//! the schema. Callers branch on kinds ([`Error::is_connection_lost`],
//! [`Error::is_transient`]), never on message text.

use std::fmt;

/// Everything that can stop a pgwake operation.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting or an input is invalid, or a request cannot be carried
    /// out as asked (`pgwake cancel` of a finished job); the message names
    /// the setting, the input or the job, and the fix, and is shown as is.
    #[error("{0}")]
    Config(String),
    /// The database URL could not be parsed (the URL itself is never printed:
    /// it may carry a password).
    #[error("invalid database URL: {0}")]
    DatabaseUrl(String),
    /// The pgwake schema is missing or older than this binary (what
    /// `pgwake migrate` fixes), or not usable as found.
    #[error("{0}")]
    Schema(String),
    /// The pgwake schema is newer than this binary: only a newer pgwake
    /// can use it (schemas never go back), so retrying cannot help.
    #[error("the pgwake schema is at version {found}, newer than this pgwake knows ({known}); upgrade pgwake")]
    SchemaNewer {
        /// The schema's version.
        found: i32,
        /// The newest version this binary knows.
        known: i32,
    },
    /// A database operation failed.
    #[error("{context}: {}", PgDisplay(source))]
    Db {
        /// What pgwake was doing.
        context: &'static str,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// A connection was lost while pgwake relied on it.
    #[error("{0}")]
    ConnectionLost(&'static str),
    /// No server answered within the connect timeout (libpq's
    /// `connect_timeout` or `PGCONNECT_TIMEOUT`, else 5 s per host): the
    /// whole set-up (TCP, TLS, start-up, authentication) counts.
    #[error("no answer from the database at {hosts} within {seconds} s (connect_timeout): check that HOST:PORT is a PostgreSQL server and reachable, or raise connect_timeout in the URL or PGCONNECT_TIMEOUT for a slow network")]
    ConnectTimeout {
        /// Every host tried, `host:port` comma-separated.
        hosts: String,
        /// The time allowed, in seconds.
        seconds: u64,
    },
    /// No connection could be taken from the pool.
    #[error("{context}: {}", PoolDisplay(source))]
    Pool {
        /// What pgwake was doing.
        context: &'static str,
        /// The pool's error.
        #[source]
        source: deadpool_postgres::PoolError,
    },
    /// The request is well-formed but cannot be done as asked (e.g. adding a
    /// schedule whose name is taken, removing one that does not exist); the
    /// message says what to do instead.
    #[error("{0}")]
    Refused(String),
    /// A TLS problem: bad certificate settings, or a server certificate or
    /// handshake refused. One line naming TLS, the host and the fix.
    #[error("{0}")]
    Tls(String),
    /// The database answered something pgwake's statements rule out (e.g.
    /// an INSERT … RETURNING without a row): a bug, or a schema changed by
    /// hand.
    #[error("unexpected answer from the database: {0}")]
    Unexpected(&'static str),
    /// A task of the worker panicked: a bug, in pgwake or in code it runs.
    /// Not a configuration problem; the log has the panic message.
    #[error("{0} panicked (a bug; the log above has the panic message)")]
    Panicked(&'static str),
    /// An I/O error outside the database.
    #[error("{context}: {source}")]
    Io {
        /// What pgwake was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// What a driver error means to pgwake. This is the one place where
/// SQLSTATEs are interpreted; everything else asks [`Error`]'s accessors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The connection is gone or unusable, or the node is the wrong one
    /// (read-only standby after a failover): reconnect, then retry.
    ConnectionLost,
    /// The statement lost a race or hit a limit that a retry can win.
    Retryable,
    /// The server refused the user or password.
    AuthFailed,
    /// The database named in the URL does not exist.
    UnknownDatabase,
    /// The role lacks a privilege the statement needs.
    PermissionDenied,
    /// The statement itself is wrong (or the data): retrying will not help.
    Other,
}

fn classify(e: &tokio_postgres::Error) -> Kind {
    if e.is_closed() {
        return Kind::ConnectionLost;
    }
    // No SQLSTATE: an I/O, TLS or protocol error on the connection, or one
    // of the driver's own checks on an answer the connection carried fine
    // (a row count or a value that does not fit: not a connection problem,
    // and never worth "check that the server is running").
    let Some(code) = e.code() else {
        return if is_answer_check(e) {
            Kind::Other
        } else {
            Kind::ConnectionLost
        };
    };
    match code.code() {
        // connection exception; admin/crash shutdown, cannot connect now
        // (starting up, in recovery), idle session timeout
        c if c.starts_with("08") || c.starts_with("57P") => Kind::ConnectionLost,
        // read_only_sql_transaction: a standby, e.g. after a failover;
        // idle_in_transaction_session_timeout: the server ended the session
        "25006" | "25P03" => Kind::ConnectionLost,
        // insufficient resources (too many connections, disk full, …)
        c if c.starts_with("53") => Kind::Retryable,
        // serialization_failure, deadlock_detected, lock_not_available,
        // query_canceled (statement_timeout)
        "40001" | "40P01" | "55P03" | "57014" => Kind::Retryable,
        // invalid_password, invalid_authorization_specification
        "28P01" | "28000" => Kind::AuthFailed,
        // invalid_catalog_name: no such database
        "3D000" => Kind::UnknownDatabase,
        // insufficient_privilege
        "42501" => Kind::PermissionDenied,
        _ => Kind::Other,
    }
}

/// The driver's checks of an answer (tokio-postgres keeps their kind
/// private; its messages are stable).
fn is_answer_check(e: &tokio_postgres::Error) -> bool {
    let m = e.to_string();
    [
        "query returned an unexpected number of rows",
        "error serializing parameter",
        "error deserializing column",
    ]
    .iter()
    .any(|prefix| m.starts_with(prefix))
}

/// Whether a driver error is transient: the connection was lost, the server
/// is shutting down or in recovery, or the statement lost a race that a retry
/// can win.
pub fn pg_is_transient(e: &tokio_postgres::Error) -> bool {
    matches!(classify(e), Kind::ConnectionLost | Kind::Retryable)
}

/// Whether a driver error says the role lacks a privilege (e.g. CHECKPOINT
/// without superuser or `pg_checkpoint`).
pub fn pg_is_permission_denied(e: &tokio_postgres::Error) -> bool {
    classify(e) == Kind::PermissionDenied
}

/// Whether a driver error means the connection is gone (or the node is the
/// wrong one, e.g. a read-only standby after a failover): reconnect.
pub fn pg_is_connection_lost(e: &tokio_postgres::Error) -> bool {
    classify(e) == Kind::ConnectionLost
}

impl Error {
    /// Wrap a driver error with what pgwake was doing.
    pub fn db(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
        move |source| Error::Db { context, source }
    }

    /// Wrap a driver error of a producer's insert with what pgwake was
    /// doing: a bound of the SQL API on a new job (SQLSTATE 54000,
    /// program_limit_exceeded, from the insert trigger `jobs_bounds`) is a
    /// usage error, [`Error::Config`], with the server's message and hint
    /// (the limit and the fix); anything else as [`Error::db`].
    pub fn db_insert(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
        move |source| match source.as_db_error() {
            Some(db) if db.code().code() == "54000" => Error::Config(match db.hint() {
                Some(hint) => format!("{context}: {} ({hint})", db.message()),
                None => format!("{context}: {}", db.message()),
            }),
            _ => Error::Db { context, source },
        }
    }

    /// Wrap a pool error with what pgwake was doing.
    pub fn pool(context: &'static str) -> impl FnOnce(deadpool_postgres::PoolError) -> Error {
        move |source| Error::Pool { context, source }
    }

    /// The driver error inside, if this is a database error.
    fn driver(&self) -> Option<&tokio_postgres::Error> {
        match self {
            Error::Db { source, .. }
            | Error::Pool {
                source: deadpool_postgres::PoolError::Backend(source),
                ..
            } => Some(source),
            _ => None,
        }
    }

    fn kind(&self) -> Option<Kind> {
        self.driver().map(classify)
    }

    /// Whether retrying later can succeed (lost connection, server restart,
    /// read-only node, pool exhausted).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::ConnectionLost(_) | Error::ConnectTimeout { .. } => true,
            Error::Pool {
                source: deadpool_postgres::PoolError::Closed,
                ..
            } => false,
            Error::Pool {
                source: deadpool_postgres::PoolError::Backend(_),
                ..
            }
            | Error::Db { .. } => {
                matches!(self.kind(), Some(Kind::ConnectionLost | Kind::Retryable))
            }
            Error::Pool { .. } => true,
            _ => false,
        }
    }

    /// Whether the database connection was lost (or is on the wrong node).
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Error::ConnectionLost(_) | Error::ConnectTimeout { .. } => true,
            Error::Pool {
                source: deadpool_postgres::PoolError::Closed,
                ..
            } => false,
            Error::Pool {
                source: deadpool_postgres::PoolError::Backend(_),
                ..
            }
            | Error::Db { .. } => self.kind() == Some(Kind::ConnectionLost),
            Error::Pool { .. } => true,
            _ => false,
        }
    }

    /// Whether the server could not be reached at all (no server answer:
    /// refused, unresolvable host, timeout, TLS or protocol failure).
    pub fn is_unreachable(&self) -> bool {
        self.driver()
            .is_some_and(|e| e.as_db_error().is_none() && !is_answer_check(e))
    }

    /// Whether the server refused the user or the password.
    pub fn is_auth_failure(&self) -> bool {
        self.kind() == Some(Kind::AuthFailed)
    }

    /// Whether the server refused the connection by its `pg_hba.conf` (no
    /// entry for this user, database, address and encryption), not for a
    /// wrong password.
    pub fn is_refused_by_hba(&self) -> bool {
        self.driver()
            .and_then(|e| e.code())
            .is_some_and(|c| c.code() == "28000")
    }

    /// Whether the database named in the connection settings does not exist.
    pub fn is_unknown_database(&self) -> bool {
        self.kind() == Some(Kind::UnknownDatabase)
    }

    /// Whether this is a usage error: invalid configuration or input, fixed
    /// by changing what was asked for (the command line exits 2). A schema
    /// newer than the binary counts: the fix is another binary, and a
    /// restart of this one can only repeat the error.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::Config(_) | Error::DatabaseUrl(_) | Error::SchemaNewer { .. }
        )
    }

    /// Prefix the message of a configuration error with where it occurred
    /// (`stdin line 3: task must not be empty`); other errors pass through.
    pub fn at(self, place: impl std::fmt::Display) -> Error {
        match self {
            Error::Config(m) => Error::Config(format!("{place}: {m}")),
            other => other,
        }
    }

    /// The SQLSTATE of a database error, if there is one.
    pub fn sqlstate(&self) -> Option<&str> {
        self.driver().and_then(|e| e.code()).map(|c| c.code())
    }
}

/// A driver error rendered for a person: the server's message and SQLSTATE
/// when there is one, the transport error otherwise. Never includes the
/// connection string.
pub struct PgDisplay<'a>(pub &'a tokio_postgres::Error);

impl fmt::Display for PgDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(f, "{} (SQLSTATE {})", db.message(), db.code().code()),
            None => {
                write!(f, "{}", self.0)?;
                let mut source = std::error::Error::source(self.0);
                while let Some(s) = source {
                    write!(f, ": {s}")?;
                    source = s.source();
                }
                Ok(())
            }
        }
    }
}

/// A pool error rendered like [`PgDisplay`] when the server answered.
struct PoolDisplay<'a>(&'a deadpool_postgres::PoolError);

impl fmt::Display for PoolDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            deadpool_postgres::PoolError::Backend(e) => PgDisplay(e).fmt(f),
            other => other.fmt(f),
        }
    }
}

/// Shorthand for results with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_is_a_bug_not_a_usage_error() {
        assert!(!Error::Panicked("a claim round").is_usage());
        assert!(!Error::Panicked("a claim round").is_transient());
        assert!(Error::Config("--batch".into()).is_usage());
        assert!(Error::DatabaseUrl("bad".into()).is_usage());
    }
}
