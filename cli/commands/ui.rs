//! `pgwake ui`: the operator console ([`pgwake::console`]) on its own
//! address, and the console flags `pgwake run` shares.

use std::net::SocketAddr;

use clap::Args;
use pgwake::error::Error;
use pgwake::{admin::schema, connect, console};
use tokio_util::sync::CancellationToken;

use super::database::Db;

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
}

/// Bind the console's address, after checking the credential (before any
/// other start-up work, so a missing PGWAKE_UI_TOKEN or a taken port is
/// the first thing said).
pub async fn prepare(
    addr: SocketAddr,
    actions: bool,
) -> Result<(tokio::net::TcpListener, console::ConsoleConfig), Error> {
    let config = console::ConsoleConfig::from_env(actions)?;
    let listener = console::bind(addr).await?;
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
    let (listener, config) = prepare(args.ui_addr, args.ui_actions).await?;
    let db = args.db.config()?;
    let client = connect::connect(&db).await?;
    schema::check(&client).await?;
    drop(client);
    let stop = CancellationToken::new();
    pgwake::signals::spawn(
        stop.clone(),
        stop.clone(),
        std::time::Duration::from_secs(1),
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
    Ok(())
}
