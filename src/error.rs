//! The error type of pgwake's boundaries: configuration, the database, and
//! the schema. Callers branch on kinds ([`Error::is_connection_lost`],
//! [`Error::is_transient`]), never on message text.

use std::fmt;

/// Everything that can stop a pgwake operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is invalid; the message names the setting and the fix.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The database URL could not be parsed (the URL itself is never printed:
    /// it may carry a password).
    #[error("invalid database URL: {0}")]
    DatabaseUrl(String),
    /// The pgwake schema is missing, older or newer than this binary.
    #[error("{0}")]
    Schema(String),
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
    /// No connection could be taken from the pool.
    #[error("{context}: {source}")]
    Pool {
        /// What pgwake was doing.
        context: &'static str,
        /// The pool's error.
        #[source]
        source: deadpool_postgres::PoolError,
    },
    /// An embedded (throwaway) PostgreSQL could not be started.
    #[error("embedded PostgreSQL: {0}")]
    Embedded(String),
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

/// SQLSTATE classes that mean "this connection or node is unusable right now,
/// try again elsewhere or later" rather than "this statement is wrong".
const TRANSIENT_SQLSTATES: &[&str] = &[
    "08",    // connection exception
    "25006", // read_only_sql_transaction: a standby / read-only node
    "40001", // serialization_failure
    "40P01", // deadlock_detected
    "53",    // insufficient resources (too many connections, disk full, ...)
    "57P01", // admin_shutdown
    "57P02", // crash_shutdown
    "57P03", // cannot_connect_now (starting up, in recovery)
    "55P03", // lock_not_available
    "57014", // query_canceled (statement_timeout)
    "25P03", // idle_in_transaction_session_timeout
];

/// Whether a driver error is transient: the connection was lost, the server
/// is shutting down or in recovery, or the statement lost a race that a retry
/// can win.
pub fn pg_is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let code = code.code();
            TRANSIENT_SQLSTATES.iter().any(|p| code.starts_with(p))
        }
        // No SQLSTATE: an I/O or protocol error on the connection.
        None => true,
    }
}

/// Whether a driver error means the connection is gone (or the node is the
/// wrong one, e.g. a read-only standby after a failover): reconnect.
pub fn pg_is_connection_lost(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let code = code.code();
            code.starts_with("08") || code.starts_with("57P") || code == "25006" || code == "25P03"
        }
        None => true,
    }
}

impl Error {
    /// Wrap a driver error with what pgwake was doing.
    pub fn db(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
        move |source| Error::Db { context, source }
    }

    /// Wrap a pool error with what pgwake was doing.
    pub fn pool(context: &'static str) -> impl FnOnce(deadpool_postgres::PoolError) -> Error {
        move |source| Error::Pool { context, source }
    }

    /// Whether retrying later can succeed (lost connection, server restart,
    /// read-only node, pool exhausted).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::ConnectionLost(_) => true,
            Error::Db { source, .. } => pg_is_transient(source),
            Error::Pool { source, .. } => match source {
                deadpool_postgres::PoolError::Backend(e) => pg_is_transient(e),
                deadpool_postgres::PoolError::Closed => false,
                _ => true,
            },
            _ => false,
        }
    }

    /// Whether the database connection was lost (or is on the wrong node).
    pub fn is_connection_lost(&self) -> bool {
        match self {
            Error::ConnectionLost(_) => true,
            Error::Db { source, .. } => pg_is_connection_lost(source),
            Error::Pool { source, .. } => match source {
                deadpool_postgres::PoolError::Backend(e) => pg_is_connection_lost(e),
                deadpool_postgres::PoolError::Closed => false,
                _ => true,
            },
            _ => false,
        }
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
        match self {
            Error::Db { source, .. } => source.code().map(|c| c.code()),
            Error::Pool {
                source: deadpool_postgres::PoolError::Backend(e),
                ..
            } => e.code().map(|c| c.code()),
            _ => None,
        }
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

/// Shorthand for results with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
