//! Connecting to PostgreSQL: the connection string and libpq environment
//! (`conninfo`) without ever echoing them (they may hold a
//! password), TLS (`tls`, libpq's `sslmode`) for every connection, the claim pool, and
//! single connections for the listener and the CLI commands.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::config::Host;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres_rustls::MakeRustlsConnect;

pub use crate::db::tls::{RootCert, SslMode, TlsSettings};
use crate::error::{Error, Result};

/// How long a new connection may take before it counts as failed.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// A connection opened by [`DbConfig::open`], plain or TLS.
pub type Connection = tokio_postgres::Connection<
    tokio_postgres::Socket,
    <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::Stream,
>;

/// The rustls connector, accepting Unix-socket hosts: tokio-postgres asks
/// for a connector with an empty host name there, which rustls refuses. No
/// handshake happens on a socket (the server answers a TLS request on a
/// socket with "no", and `sslmode` is ignored for sockets, as in libpq).
#[derive(Clone)]
pub struct Tls(MakeRustlsConnect);

impl MakeTlsConnect<tokio_postgres::Socket> for Tls {
    type Stream = <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<tokio_postgres::Socket>>::Error;

    fn make_tls_connect(
        &mut self,
        host: &str,
    ) -> std::result::Result<Self::TlsConnect, Self::Error> {
        let host = if host.is_empty() { "localhost" } else { host };
        MakeTlsConnect::<tokio_postgres::Socket>::make_tls_connect(&mut self.0, host)
    }
}

/// libpq ignores `sslmode` for Unix sockets; so does pgwake when every host
/// is a socket.
fn driver_mode(pg: &tokio_postgres::Config, tls: &TlsSettings) -> tokio_postgres::config::SslMode {
    let all_sockets =
        !pg.get_hosts().is_empty() && pg.get_hosts().iter().all(|h| matches!(h, Host::Unix(_)));
    if all_sockets {
        tokio_postgres::config::SslMode::Disable
    } else {
        tls.driver_mode()
    }
}

/// Where and how to connect: the driver's settings plus TLS. Dereferences
/// to [`tokio_postgres::Config`], so its getters and setters work as before.
#[derive(Clone)]
pub struct DbConfig {
    pg: tokio_postgres::Config,
    tls: TlsSettings,
    connector: Tls,
}

impl std::fmt::Debug for DbConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("DbConfig")
            .field("target", &describe(self))
            .field("tls", &self.tls)
            .finish()
    }
}

impl std::ops::Deref for DbConfig {
    type Target = tokio_postgres::Config;

    fn deref(&self) -> &tokio_postgres::Config {
        &self.pg
    }
}

impl std::ops::DerefMut for DbConfig {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.pg
    }
}

impl From<tokio_postgres::Config> for DbConfig {
    /// A driver configuration as it is: its `sslmode` (disable, prefer or
    /// require, certificates unchecked), no client certificate.
    fn from(mut pg: tokio_postgres::Config) -> DbConfig {
        use tokio_postgres::config::SslMode as D;
        let mode = match pg.get_ssl_mode() {
            D::Disable => crate::db::tls::SslMode::Disable,
            D::Require => crate::db::tls::SslMode::Require,
            _ => crate::db::tls::SslMode::Prefer,
        };
        let tls = TlsSettings {
            mode,
            ..TlsSettings::default()
        };
        let connector = Tls(tls
            .connector()
            .expect("an unverified connector reads no files and cannot fail"));
        let mode = driver_mode(&pg, &tls);
        pg.ssl_mode(mode);
        DbConfig { pg, tls, connector }
    }
}

impl DbConfig {
    /// Assemble from driver settings and TLS settings (reads the certificate
    /// files now).
    pub fn new(mut pg: tokio_postgres::Config, tls: TlsSettings) -> Result<DbConfig> {
        let mode = driver_mode(&pg, &tls);
        pg.ssl_mode(mode);
        let connector = Tls(tls.connector()?);
        Ok(DbConfig { pg, tls, connector })
    }

    /// The TLS settings.
    pub fn tls(&self) -> &TlsSettings {
        &self.tls
    }

    /// The driver settings.
    pub fn pg(&self) -> &tokio_postgres::Config {
        &self.pg
    }

    /// Open one connection; the caller drives it (the listener polls its
    /// messages). TLS errors come back as [`Error::Tls`], one line naming
    /// the host and the fix.
    pub async fn open(&self) -> Result<(tokio_postgres::Client, Connection)> {
        // tokio-postgres bounds only the TCP connect by connect_timeout; libpq
        // bounds the whole set-up (TLS, start-up, authentication) per host.
        // A server that accepts and never answers must not hang a command
        // or a worker.
        let per_host = self.connect_timeout();
        let limit = per_host * self.pg.get_hosts().len().max(1) as u32;
        match tokio::time::timeout(limit, self.pg.connect(self.connector.clone())).await {
            Ok(r) => r.map_err(|e| self.connect_error(e, "cannot connect to the database")),
            Err(_) => Err(Error::ConnectTimeout {
                hosts: hosts(self),
                seconds: per_host.as_secs().max(1),
            }),
        }
    }

    /// The time one host may take to answer: `connect_timeout` (URL or
    /// `PGCONNECT_TIMEOUT`), else [`CONNECT_TIMEOUT_DEFAULT`].
    pub fn connect_timeout(&self) -> Duration {
        self.pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT_DEFAULT)
    }

    /// Turn a connection error into pgwake's error, recognising TLS failures.
    pub fn connect_error(&self, e: tokio_postgres::Error, context: &'static str) -> Error {
        match crate::db::tls::explain(&e, &hosts(self)) {
            Some(line) => Error::Tls(line),
            None => Error::Db { context, source: e },
        }
    }
}

/// Parse a `postgres://` URL or `key=value` connection string, filling what
/// it leaves out from the libpq environment (`PGHOST`, `PGUSER`,
/// `PGPASSWORD`, `PGSSLMODE`, …). The error names the problem, never the URL.
pub fn parse_url(url: &str) -> Result<DbConfig> {
    from_parts(Some(url), &|k| std::env::var(k).ok())
}

/// The database to use: `url` (e.g. `DATABASE_URL`) if given, else the libpq
/// environment alone. With neither, the error says what to set.
pub fn resolve(url: Option<&str>) -> Result<DbConfig> {
    let env = |k: &str| std::env::var(k).ok();
    if url.is_none()
        && !crate::db::conninfo::LOCATION_VARS
            .iter()
            .any(|v| env(v).is_some_and(|s| !s.is_empty()))
    {
        return Err(Error::Config(
            "no database: set DATABASE_URL (or pass --database-url postgres://USER@HOST/DB), or the libpq variables PGHOST, PGUSER, PGDATABASE, …".into(),
        ));
    }
    from_parts(url, &env)
}

/// [`parse_url`] with an explicit environment (tests).
pub fn from_parts(url: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Result<DbConfig> {
    let parsed = crate::db::conninfo::parse(url.unwrap_or(""))?;
    let (mut config, tls) = crate::db::conninfo::apply_env(parsed, env)?;
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
    DbConfig::new(config, tls)
}

/// Every host of `config`, `host:port` comma-separated, for messages.
pub fn hosts(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match h {
                Host::Tcp(h) => format!("{h}:{port}"),
                Host::Unix(p) => format!("{}/.s.PGSQL.{port}", p.display()),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `user@host:port/dbname`, for logs and errors. Never the password.
pub fn describe(config: &tokio_postgres::Config) -> String {
    format!(
        "{}@{}/{}",
        config.get_user().unwrap_or("?"),
        hosts(config),
        config.get_dbname().or(config.get_user()).unwrap_or("?")
    )
}

/// A copy of `config` whose connections carry `application_name`.
pub fn with_application_name(config: &DbConfig, name: &str) -> DbConfig {
    let mut c = config.clone();
    c.application_name(name);
    c
}

/// Build the claim pool: `max_size` connections. Reuse checks only that the
/// socket is still open (`RecyclingMethod::Fast`): a round trip per checkout
/// would cost as much as a batch-1 claim, and a connection that fails anyway
/// is discarded by the claim (never returned to the pool mid-transaction),
/// so the next checkout gets a fresh one.
pub fn pool(config: &DbConfig, max_size: usize) -> Result<Pool> {
    let manager = Manager::from_config(
        config.pg.clone(),
        config.connector.clone(),
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(max_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(Duration::from_secs(30)))
        .create_timeout(Some(
            config.connect_timeout() * config.get_hosts().len().max(1) as u32,
        ))
        .recycle_timeout(Some(Duration::from_secs(5)))
        .build()
        .map_err(|e| Error::Config(format!("cannot build the connection pool: {e}")))
}

/// Open one connection and drive it on a background task; for one-shot
/// commands (`migrate`, `enqueue`, `stats`).
pub async fn connect(config: &DbConfig) -> Result<tokio_postgres::Client> {
    let (client, connection) = config.open().await?;
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
pub(crate) struct PooledConn(Option<deadpool_postgres::Object>);

impl PooledConn {
    /// Check a connection out of `pool`.
    pub(crate) async fn get(pool: &Pool, context: &'static str) -> Result<PooledConn> {
        let conn = pool.get().await.map_err(Error::pool(context))?;
        Ok(PooledConn(Some(conn)))
    }

    /// Pass a result through, discarding the connection if it failed for a
    /// connection-level reason.
    pub(crate) fn check<T>(
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

/// Whether `pool`'s connections share server connections: a second client
/// connection, opened while the first is still connected, was served by the
/// same server process that served the first one's last statement. That is
/// a pooler in transaction (or statement) mode — PgBouncer's
/// `pool_mode=transaction` hands the server connection a client released at
/// the end of a transaction to the next client (last in, first out). A
/// direct connection or session pooling never does this. `true` is proof;
/// `false` is not (a busy pooler may give the second client another server
/// connection). Three round trips, simple query protocol only.
pub async fn shares_server_connections(pool: &Pool) -> Result<bool> {
    let first = pool
        .get()
        .await
        .map_err(Error::pool("pooling check: no connection"))?;
    let released = backend_pid(&first, "SELECT pg_backend_pid()").await?;
    let second = pool
        .get()
        .await
        .map_err(Error::pool("pooling check: no connection"))?;
    let taken = backend_pid(&second, "BEGIN; SELECT pg_backend_pid(); COMMIT").await?;
    Ok(released == taken)
}

async fn backend_pid(client: &tokio_postgres::Client, sql: &str) -> Result<String> {
    let messages = client
        .simple_query(sql)
        .await
        .map_err(Error::db("pooling check"))?;
    messages
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .ok_or(Error::Unexpected("pg_backend_pid() returned no row"))
}

/// How the worker's claims go over `--database-url`, as the start-up check
/// decided ([`check_pooling`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    /// How claim-path statements are sent: never
    /// [`Auto`](crate::config::PreparedStatements::Auto).
    pub prepared: crate::config::PreparedStatements,
    /// Whether the listener may LISTEN (false: poll only).
    pub listen: bool,
}

/// Decide what the worker's claims send through `pool` and refuse what
/// cannot work there, before the worker starts. Through a transaction-mode
/// pooler (PgBouncer's `pool_mode=transaction`), named prepared statements
/// cannot pass from one transaction to the next, and LISTEN through it hears
/// nothing (a notification is delivered to the session that listens; the
/// pooler gives that server connection to other clients between
/// transactions). So, when one is found:
/// [`Auto`](crate::config::PreparedStatements::Auto) becomes `Unnamed`, an
/// explicit `Cached` is refused, and a listener that would connect through
/// the same pooler (`listen_through_pool`) is turned off (the worker polls)
/// unless `prepared` was given explicitly, in which case it is refused too,
/// naming `--listen-database-url`. Each choice is logged.
pub async fn check_pooling(
    pool: &Pool,
    prepared: crate::config::PreparedStatements,
    listen: bool,
    listen_through_pool: bool,
    poll_interval: std::time::Duration,
) -> Result<Pooling> {
    use crate::config::PreparedStatements;
    if !shares_server_connections(pool).await? {
        let prepared = match prepared {
            PreparedStatements::Auto => PreparedStatements::Cached,
            given => given,
        };
        return Ok(Pooling { prepared, listen });
    }
    const FOUND: &str = "--database-url goes through a pooler in transaction mode (two client connections were served by one server connection in turn: PgBouncer's pool_mode=transaction)";
    if prepared == PreparedStatements::Cached {
        return Err(Error::Config(format!(
            "{FOUND}, which cannot carry the worker's named prepared statements from one transaction to the next: leave --prepared-statements at auto (the default) or set it to unnamed (PGWAKE_PREPARED_STATEMENTS), or point --database-url at the server or a session-mode pool"
        )));
    }
    let mut listen = listen;
    if listen && listen_through_pool {
        if prepared == PreparedStatements::Unnamed {
            return Err(Error::Config(format!(
                "{FOUND}, where LISTEN cannot receive notifications: set --listen-database-url (PGWAKE_LISTEN_DATABASE_URL) to the server itself, or --no-listen to poll"
            )));
        }
        tracing::warn!(
            poll_interval = ?poll_interval,
            "claims go through a transaction-mode pooler, where LISTEN hears no notifications: polling instead (new jobs wait up to the poll interval); set --listen-database-url (PGWAKE_LISTEN_DATABASE_URL) to the server itself for instant pickup"
        );
        listen = false;
    }
    if prepared == PreparedStatements::Auto {
        tracing::info!("claims go through a transaction-mode pooler: statements are sent unnamed (--prepared-statements auto)");
    }
    Ok(Pooling {
        prepared: PreparedStatements::Unnamed,
        listen,
    })
}
