//! Connecting to PostgreSQL: parsing the database URL without ever echoing
//! it (it may hold a password), the claim pool, and single connections for
//! the listener.
//!
//! TLS: this build connects without TLS (`sslmode=disable` or `prefer`
//! falling back to plain). A URL with `sslmode=require` is refused at start-up
//! with a message saying so, rather than failing on the first connection.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::{Config, NoTls};

use crate::error::{Error, Result};

/// How long a new connection may take before it counts as failed.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// Parse a `postgres://` URL or `key=value` connection string. The error
/// names the problem, never the URL.
pub fn parse_url(url: &str) -> Result<Config> {
    let mut config: Config = url.parse().map_err(|e: tokio_postgres::Error| {
        // The driver's parse errors name the offending key, not its value.
        Error::DatabaseUrl(format!(
            "{e}; expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE"
        ))
    })?;
    if config.get_hosts().is_empty() {
        return Err(Error::DatabaseUrl(
            "no host given; expected postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE".into(),
        ));
    }
    if config.get_ssl_mode() == SslMode::Require {
        return Err(Error::DatabaseUrl(
            "sslmode=require is not supported by this build of pgwake (no TLS); use sslmode=disable or prefer".into(),
        ));
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT_DEFAULT);
    }
    // Detect half-open connections at the TCP level as well; the listener
    // also pings.
    config.keepalives(true);
    config.keepalives_idle(Duration::from_secs(30));
    // Sent data unacknowledged this long (the peer vanished mid-request)
    // fails the connection instead of hanging on TCP retransmits for ~15 min.
    config.tcp_user_timeout(Duration::from_secs(30));
    Ok(config)
}

/// `user@host:port/dbname`, for logs and errors. Never the password.
pub fn describe(config: &Config) -> String {
    let host = match config.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "?".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{}:{}/{}",
        config.get_user().unwrap_or("?"),
        host,
        port,
        config.get_dbname().unwrap_or("?")
    )
}

/// A copy of `config` whose connections carry `application_name`.
pub fn with_application_name(config: &Config, name: &str) -> Config {
    let mut c = config.clone();
    c.application_name(name);
    c
}

/// Build the claim pool: `max_size` connections. Reuse checks only that the
/// socket is still open (`RecyclingMethod::Fast`): a round trip per checkout
/// would cost as much as a batch-1 claim, and a connection that fails anyway
/// is discarded by the claim (never returned to the pool mid-transaction),
/// so the next checkout gets a fresh one.
pub fn pool(config: &Config, max_size: usize) -> Result<Pool> {
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(
            config
                .get_connect_timeout()
                .copied()
                .unwrap_or(CONNECT_TIMEOUT_DEFAULT),
        ))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()
        .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))
}

/// Open one connection and drive it on a background task; for one-shot
/// commands (`migrate`, `enqueue`, `stats`).
pub async fn connect(config: &Config) -> Result<tokio_postgres::Client> {
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(Error::db("cannot connect to the database"))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %crate::error::PgDisplay(&e), "connection closed");
        }
    });
    Ok(client)
}

/// A pooled connection that is closed, not returned to the pool, after an
/// error saying the connection or the node is unusable (lost connection,
/// server shutting down, read-only standby after a failover): the next
/// checkout then opens a fresh connection, possibly to the new primary.
pub struct PooledConn(Option<deadpool_postgres::Object>);

impl PooledConn {
    /// Check a connection out of `pool`.
    pub async fn get(pool: &Pool, context: &'static str) -> Result<PooledConn> {
        let conn = pool.get().await.map_err(Error::pool(context))?;
        Ok(PooledConn(Some(conn)))
    }

    /// Pass a result through, discarding the connection if it failed for a
    /// connection-level reason.
    pub fn check<T>(
        &mut self,
        r: std::result::Result<T, tokio_postgres::Error>,
    ) -> std::result::Result<T, tokio_postgres::Error> {
        if let Err(e) = &r {
            if crate::error::pg_is_connection_lost(e) {
                if let Some(conn) = self.0.take() {
                    drop(deadpool_postgres::Object::take(conn));
                }
            }
        }
        r
    }
}

impl std::ops::Deref for PooledConn {
    type Target = deadpool_postgres::Object;

    fn deref(&self) -> &Self::Target {
        self.0
            .as_ref()
            .expect("a discarded connection is not used again")
    }
}
