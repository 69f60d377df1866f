//! The operator console: server-rendered web pages to see and act on
//! jobs, queues, schedules and workers (`pgwake ui`, `pgwake run
//! --ui-addr`, `pgwake demo`). It reads and acts only through
//! [`crate::admin`], never the claim path, on its own small pool, each
//! page in one read-only transaction under a short `statement_timeout`.
//!
//! ```text
//!  browser ── every request: bounded input (else 400), Host of this console (else 421),
//!     │       off loopback a session for reads too (else to the login)
//!     ├──── GET /, /workers, /jobs, /jobs/{id}, /queues, /schedules
//!     │          └─ read-only transaction (statement_timeout, lock_timeout) ── admin::*
//!     └──── POST /actions/…, /bulk/…   (only with --ui-actions)
//!                └─ session cookie (login with PGWAKE_UI_TOKEN) + CSRF token + Origin check
//!                     └─ transaction as the console's database role ── admin::*
//! ```
//!
//! Everything it shows is escaped by the templates (`maud`); the pages load
//! nothing from elsewhere (CSS and the few lines of script are served by
//! the console itself) and a `Content-Security-Policy` forbids anything
//! else. `docs/src/console.md` is the operator's guide.

mod actions;
mod auth;
mod charts;
mod error;
mod input;
mod pages;
mod reasons;
mod view;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{get, post};
use axum::Router;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};

pub use input::{FIELDS_MAX, FORM_MAX, PATH_MAX, PAYLOAD_DEPTH_MAX, QUERY_MAX, VALUE_MAX};

/// Where `pgwake ui` serves the console when not told otherwise: loopback
/// only.
pub const UI_ADDR_DEFAULT: &str = "127.0.0.1:9190";

/// The environment variable holding the credential for actions.
pub const TOKEN_ENV: &str = "PGWAKE_UI_TOKEN";

/// Shortest credential accepted, in characters.
pub const TOKEN_MIN_LEN: usize = 16;

/// Login attempts the console checks in a burst (for all clients
/// together); then one more every [`LOGIN_FAILURE_REFILL`]. A right
/// credential does not count.
pub const LOGIN_FAILURES_BURST: usize = 10;

/// How often the login bucket gains one attempt back.
pub const LOGIN_FAILURE_REFILL: Duration = Duration::from_secs(6);

/// Connections of the console's own pool.
pub const POOL_SIZE: usize = 4;

/// `statement_timeout` of every statement a page or an action runs.
pub const STATEMENT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// The `application_name` of the console's connections.
pub const APPLICATION_NAME: &str = "pgwake-console";

/// How the console behaves.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// Allow state-changing actions (retry, cancel, pause, limits, bulk,
    /// run a schedule now). Off: read-only, every POST is refused (403).
    pub actions: bool,
    /// The credential an operator logs in with to act; required when
    /// `actions` is on (at least [`TOKEN_MIN_LEN`] characters).
    pub token: Option<String>,
    /// `statement_timeout` of its statements.
    pub statement_timeout: Duration,
    /// How often the overview refreshes itself in the browser.
    pub refresh: Duration,
    /// Host names the console answers to besides an IP address and, when
    /// it listens on loopback or every address, `localhost` on its port
    /// (`--ui-host`): `NAME` (any port) or `NAME:PORT`. A request naming
    /// any other host gets 421: a page of another site whose name was
    /// rebound to this address cannot read it (DNS rebinding).
    pub hosts: Vec<String>,
    /// On an address other than loopback, serve the pages to anyone who
    /// can reach it, without a login (`--ui-open-reads`). Off: reading
    /// needs the credential too, as acting does.
    pub open_reads: bool,
    /// Reading needs the credential on every address, loopback too
    /// (`--ui-login-reads`): for a console on loopback behind a proxy on
    /// the same host, which serves it to whoever the proxy lets through.
    pub login_reads: bool,
    /// The session cookie is `__Host-pgwake_console` with `Secure`
    /// (`--ui-secure-cookie`): for a console served behind TLS.
    pub secure_cookie: bool,
    /// Where a job's trace opens in the operator's tracing UI
    /// (`--ui-trace-link`): an `http(s)://` URL holding `{trace_id}`, which
    /// the job page replaces with the job's trace id, e.g.
    /// `https://jaeger.example.com/trace/{trace_id}`. `None`: the page shows
    /// the trace id without a link.
    pub trace_link: Option<String>,
}

/// The longest [`ConsoleConfig::trace_link`] template, in bytes.
pub const TRACE_LINK_MAX: usize = 2048;

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            actions: false,
            token: None,
            statement_timeout: STATEMENT_TIMEOUT_DEFAULT,
            refresh: Duration::from_secs(3),
            hosts: Vec::new(),
            open_reads: false,
            login_reads: false,
            secure_cookie: false,
            trace_link: None,
        }
    }
}

impl ConsoleConfig {
    /// Read-only, or with actions and the credential from
    /// [`TOKEN_ENV`] (refused when it is missing or short).
    pub fn from_env(actions: bool) -> Result<ConsoleConfig> {
        let config = ConsoleConfig {
            actions,
            token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            ..ConsoleConfig::default()
        };
        config.validate()?;
        Ok(config)
    }

    /// Refuse actions without a credential, and a credential too short to
    /// resist guessing.
    pub fn validate(&self) -> Result<()> {
        if let Some(t) = &self.trace_link {
            check_trace_link(t)?;
        }
        if !self.actions {
            return Ok(());
        }
        match &self.token {
            None => Err(Error::Config(format!(
                "--ui-actions needs a credential: set {TOKEN_ENV} to a secret of at least \
                 {TOKEN_MIN_LEN} characters, saved first so that operators can log in with it: \
                 (umask 077; openssl rand -hex 24 > ~/.pgwake-ui-token); then \
                 start it with {TOKEN_ENV}=$(cat ~/.pgwake-ui-token) in its environment"
            ))),
            Some(t) => check_token(t),
        }
    }

    /// [`ConsoleConfig::validate`], and on `addr` other than loopback a
    /// credential for reads too, unless [`ConsoleConfig::open_reads`].
    pub fn validate_for(&self, addr: SocketAddr) -> Result<()> {
        self.validate()?;
        if !self.reads_need_login(addr) {
            return Ok(());
        }
        match &self.token {
            None if self.login_reads => Err(Error::Config(format!(
                "--ui-login-reads needs a credential: set {TOKEN_ENV} to a secret of at least \
                 {TOKEN_MIN_LEN} characters (operators log in with it to read, and with \
                 --ui-actions to act)"
            ))),
            None => Err(Error::Config(format!(
                "--ui-addr {addr} is not a loopback address: anyone who reaches it could read \
                 every payload, error and result. Set {TOKEN_ENV} to a secret of at least \
                 {TOKEN_MIN_LEN} characters (operators log in with it to read, and with \
                 --ui-actions to act), or pass --ui-open-reads to serve the pages to anyone \
                 who can reach it"
            ))),
            Some(t) => check_token(t),
        }
    }

    /// Whether reading needs a login on `addr`: every address but
    /// loopback, unless [`ConsoleConfig::open_reads`]; every address with
    /// [`ConsoleConfig::login_reads`].
    pub fn reads_need_login(&self, addr: SocketAddr) -> bool {
        self.login_reads || (!addr.ip().is_loopback() && !self.open_reads)
    }
}

/// A trace link template: `http://` or `https://`, with `{trace_id}`, no
/// whitespace or control character, at most [`TRACE_LINK_MAX`] bytes.
fn check_trace_link(t: &str) -> Result<()> {
    let scheme = t.starts_with("https://") || t.starts_with("http://");
    if !scheme
        || !t.contains("{trace_id}")
        || t.len() > TRACE_LINK_MAX
        || t.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(Error::Config(format!(
            "--ui-trace-link {:?}: give an http:// or https:// URL of at most {TRACE_LINK_MAX} bytes, without spaces, holding {{trace_id}} where the trace id goes, e.g. --ui-trace-link 'https://jaeger.example.com/trace/{{trace_id}}'",
            t.chars().take(80).collect::<String>()
        )));
    }
    Ok(())
}

/// A credential an operator can type into the login form: at least
/// [`TOKEN_MIN_LEN`] characters, at most [`VALUE_MAX`] (the form's bound),
/// no control character.
fn check_token(t: &str) -> Result<()> {
    let n = t.chars().count();
    if n < TOKEN_MIN_LEN {
        return Err(Error::Config(format!(
            "{TOKEN_ENV} is too short: use at least {TOKEN_MIN_LEN} characters"
        )));
    }
    if n > VALUE_MAX || t.chars().any(char::is_control) {
        return Err(Error::Config(format!(
            "{TOKEN_ENV} cannot be typed into the login form: use at most {VALUE_MAX} \
             characters and no control character"
        )));
    }
    Ok(())
}

/// The console's own pool: [`POOL_SIZE`] connections named
/// [`APPLICATION_NAME`], apart from any worker's.
pub fn pool(db: &crate::connect::DbConfig) -> Result<deadpool_postgres::Pool> {
    crate::connect::pool(
        &crate::connect::with_application_name(db, APPLICATION_NAME),
        POOL_SIZE,
    )
}

/// Bind the console's address (fails fast when it is taken).
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| {
            Error::Config(format!(
                "--ui-addr {addr}: cannot listen ({e}); pick another address, e.g. --ui-addr 127.0.0.1:0 for any free port"
            ))
        })
}

/// Shared by every request.
pub(crate) struct Inner {
    pool: deadpool_postgres::Pool,
    config: ConsoleConfig,
    /// The address it listens on.
    bound: SocketAddr,
    sessions: auth::Sessions,
    secrets: auth::Secrets,
    limiter: auth::Limiter,
    /// The overview's last sample, shared by every tab (`pages::overview_body`).
    overview: pages::SharedOverview,
}

type App = Arc<Inner>;

/// Serve the console on `listener` until `shutdown`, reading through
/// `pool` (see [`pool`]). Returns the bound address.
pub fn serve_on(
    listener: tokio::net::TcpListener,
    pool: deadpool_postgres::Pool,
    config: ConsoleConfig,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let bound = listener.local_addr().map_err(|source| Error::Io {
        context: "console listener".into(),
        source,
    })?;
    config.validate_for(bound)?;
    let app: App = Arc::new(Inner {
        pool,
        config,
        bound,
        sessions: auth::Sessions::default(),
        secrets: auth::Secrets::default(),
        limiter: auth::Limiter::default(),
        overview: pages::SharedOverview::default(),
    });
    let router = Router::new()
        .route("/", get(pages::overview))
        .route("/fragment/overview", get(pages::overview_fragment))
        .route("/workers", get(pages::workers))
        .route("/jobs", get(pages::jobs))
        .route("/jobs/{id}", get(pages::job))
        .route("/jobs/{id}/errors", get(pages::job_errors))
        .route("/queues", get(pages::queues))
        .route("/schedules", get(pages::schedules))
        .route("/login", get(pages::login_page).post(auth::login))
        .route("/logout", post(auth::logout))
        .route("/actions/job", post(actions::job_action))
        .route("/actions/queue", post(actions::queue_action))
        .route("/actions/schedule", post(actions::schedule_action))
        .route("/bulk/review", post(actions::bulk_review))
        .route("/bulk/apply", post(actions::bulk_apply))
        .route("/assets/console.css", get(view::css))
        .route("/assets/console.js", get(view::js))
        .route("/assets/favicon.svg", get(view::favicon))
        .route("/favicon.ico", get(view::favicon))
        .fallback(pages::not_found)
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            auth::gate,
        ))
        .layer(axum::middleware::from_fn(input::bounds))
        .layer(axum::middleware::map_response(view::secure_headers))
        .layer(axum::middleware::from_fn_with_state(
            app.clone(),
            error::with_actions,
        ))
        .with_state(app);
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_must_be_typeable_and_long_enough() {
        let with = |t: &str| ConsoleConfig {
            actions: true,
            token: Some(t.to_string()),
            ..ConsoleConfig::default()
        };
        assert!(with(&"x".repeat(TOKEN_MIN_LEN)).validate().is_ok());
        for bad in [
            "short".to_string(),
            "x".repeat(VALUE_MAX + 1),
            format!("{}\n", "x".repeat(TOKEN_MIN_LEN)),
        ] {
            assert!(with(&bad).validate().is_err(), "{bad:?}");
        }
        let network: SocketAddr = "0.0.0.0:9190".parse().unwrap();
        let loopback: SocketAddr = "127.0.0.1:9190".parse().unwrap();
        let read_only = ConsoleConfig::default();
        assert!(read_only.validate_for(loopback).is_ok());
        assert!(read_only.validate_for(network).is_err());
        let open = ConsoleConfig {
            open_reads: true,
            ..ConsoleConfig::default()
        };
        assert!(open.validate_for(network).is_ok());
    }

    #[test]
    fn a_trace_link_is_an_http_url_with_the_trace_id_in_it() {
        let with = |t: &str| ConsoleConfig {
            trace_link: Some(t.to_string()),
            ..ConsoleConfig::default()
        };
        assert!(with("https://jaeger.example.com/trace/{trace_id}")
            .validate()
            .is_ok());
        for bad in [
            "https://jaeger.example.com/trace/".to_string(),
            "javascript:alert(1)//{trace_id}".to_string(),
            "https://tempo.example.com/{trace_id} x".to_string(),
            format!("https://{}/{{trace_id}}", "x".repeat(TRACE_LINK_MAX)),
        ] {
            let e = with(&bad).validate().unwrap_err().to_string();
            assert!(e.contains("--ui-trace-link"), "{bad:?}: {e}");
        }
    }
}
