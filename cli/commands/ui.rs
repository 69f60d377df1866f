//! `pgwake ui`: the operator console ([`pgwake::console`]) on its own
//! address, and the console flags `pgwake run` shares.

use std::net::SocketAddr;

use clap::Args;
use pgwake::error::Error;
use pgwake::{admin::schema, connect, console};
use tokio_util::sync::CancellationToken;

use super::database::Db;

/// How long `pgwake ui` lets the requests in flight finish after SIGTERM
/// before its watchdog counts down (`tests/repository/deploy.rs` reads it:
/// the units' stop timeouts must exceed it plus the watchdog's margins).
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// `pgwake ui` flags.
#[derive(Args)]
pub struct UiArgs {
    #[command(flatten)]
    pub db: Db,
    /// Where to serve the console. Loopback by default: serving it elsewhere is a deliberate
    /// choice (put TLS in front of it).
    #[arg(long, default_value = console::UI_ADDR_DEFAULT)]
    pub ui_addr: SocketAddr,
    /// Allow state-changing actions (retry, cancel, pause, limits, bulk actions, run a schedule
    /// now) to operators who log in with the credential in PGWAKE_UI_TOKEN (required). Without
    /// it the console is read-only.
    #[arg(long)]
    pub ui_actions: bool,
    #[command(flatten)]
    pub console: ConsoleFlags,
}

/// Who may reach the console: the flags `pgwake ui` and `pgwake run`
/// share.
#[derive(Args, Default, Clone, Debug)]
pub struct ConsoleFlags {
    /// A host name the console answers to (the Host header), besides an IP address and
    /// localhost: the name operators reach it by, e.g. behind a proxy. NAME for any port,
    /// NAME:PORT for one; repeatable. Any other name gets 421 (against DNS rebinding).
    #[arg(long, value_name = "NAME")]
    pub ui_host: Vec<String>,
    /// On an address other than loopback, serve the pages to anyone who can reach it, without
    /// a login. Without it, reading there needs PGWAKE_UI_TOKEN too (operators log in).
    #[arg(long, conflicts_with = "ui_login_reads")]
    pub ui_open_reads: bool,
    /// Reading needs PGWAKE_UI_TOKEN on every address, loopback too: for a console on loopback
    /// behind a proxy on the same host, which would serve the pages to whoever it lets through.
    #[arg(long)]
    pub ui_login_reads: bool,
    /// The console is served behind TLS: the session cookie gets Secure and the __Host- prefix.
    #[arg(long)]
    pub ui_secure_cookie: bool,
    /// Link each job's trace id to the operator's tracing UI: an http(s) URL in which
    /// {trace_id} is replaced, e.g. 'https://jaeger.example.com/trace/{trace_id}' or a
    /// Grafana Tempo explore URL.
    #[arg(long, value_name = "URL_TEMPLATE")]
    pub ui_trace_link: Option<String>,
}

impl ConsoleFlags {
    /// Whether any of them was given.
    pub fn any(&self) -> bool {
        !self.ui_host.is_empty()
            || self.ui_open_reads
            || self.ui_login_reads
            || self.ui_secure_cookie
            || self.ui_trace_link.is_some()
    }
}

/// Bind the console's address, after checking the credential (before any
/// other start-up work, so a missing PGWAKE_UI_TOKEN or a taken port is
/// the first thing said).
pub async fn prepare(
    addr: SocketAddr,
    actions: bool,
    flags: &ConsoleFlags,
) -> Result<(tokio::net::TcpListener, console::ConsoleConfig), Error> {
    let config = console::ConsoleConfig {
        hosts: flags.ui_host.clone(),
        open_reads: flags.ui_open_reads,
        login_reads: flags.ui_login_reads,
        secure_cookie: flags.ui_secure_cookie,
        trace_link: flags.ui_trace_link.clone(),
        ..console::ConsoleConfig::from_env(actions)?
    };
    for name in &config.hosts {
        if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(Error::Config(format!(
                "--ui-host {name:?}: give a host name, e.g. --ui-host console.example.com or --ui-host console.example.com:8443"
            )));
        }
    }
    config.validate_for(addr)?;
    let listener = console::bind(addr).await?;
    let bound = listener.local_addr().map_err(|source| Error::Io {
        context: "console listener".into(),
        source,
    })?;
    if config.open_reads && !bound.ip().is_loopback() {
        tracing::warn!(
            addr = %bound,
            "--ui-open-reads: the console serves every page without a login on a network \
             address: every payload, error and result, and other sessions' SQL, is readable by \
             anyone who can reach it"
        );
    }
    if bound.ip().is_loopback() && !config.hosts.is_empty() && !config.reads_need_login(bound) {
        tracing::warn!(
            addr = %bound,
            "--ui-host on a loopback address: a proxy on this host serves the console's pages \
             without a login to whoever it lets through; pass --ui-login-reads (with \
             PGWAKE_UI_TOKEN) to make reading need the credential"
        );
    }
    Ok((listener, config))
}

/// Serve the console on `listener` with its own pool until `shutdown`;
/// logs and returns its URL and its task.
pub fn start(
    listener: tokio::net::TcpListener,
    config: console::ConsoleConfig,
    db: &connect::DbConfig,
    shutdown: CancellationToken,
) -> Result<(String, tokio::task::JoinHandle<()>), Error> {
    let actions = config.actions;
    let pool = console::pool(db)?;
    let (addr, task) = console::serve_on(listener, pool, config, shutdown)?;
    let url = format!("http://{addr}/");
    tracing::info!(
        %url,
        mode = if actions { "actions on (log in with PGWAKE_UI_TOKEN)" } else { "read-only" },
        "serving the console"
    );
    Ok((url, task))
}

/// Run `pgwake ui` until SIGTERM/SIGINT.
pub async fn command(args: UiArgs) -> Result<(), Error> {
    let (listener, config) = prepare(args.ui_addr, args.ui_actions, &args.console).await?;
    let db = args.db.config()?;
    let client = connect::connect(&db).await?;
    schema::check(&client).await?;
    drop(client);
    let stop = CancellationToken::new();
    pgwake::signals::spawn_for(
        pgwake::signals::Stopping::Console,
        stop.clone(),
        stop.clone(),
        STOP_GRACE,
    )?;
    let actions = config.actions;
    let (url, task) = start(listener, config, &db, stop)?;
    println!(
        "pgwake console at {url} ({})",
        if actions {
            "actions on: log in with PGWAKE_UI_TOKEN"
        } else {
            "read-only"
        }
    );
    task.await
        .map_err(|_| Error::Panicked("the console's server"))?;
    tracing::info!("console stopped");
    Ok(())
}
