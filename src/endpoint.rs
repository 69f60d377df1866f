//! The HTTP endpoint: `/metrics` (Prometheus text format, scrape only),
//! `/health` (the process is alive) and `/ready` (503 while the database or
//! the listener is down, or the worker waits for its schema). It binds
//! exactly where `--metrics-addr` says; the default is loopback, so
//! exposing it is a deliberate choice (`--metrics-addr 0.0.0.0:9187`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::health::Health;

#[derive(Clone)]
struct AppState {
    metrics: PrometheusHandle,
    health: Arc<Health>,
}

async fn metrics(State(s): State<AppState>) -> ([(&'static str, &'static str); 1], String) {
    s.metrics.run_upkeep();
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        s.metrics.render(),
    )
}

async fn alive() -> &'static str {
    "ok\n"
}

async fn ready(State(s): State<AppState>) -> (StatusCode, String) {
    let schema = match s.health.schema_pending() {
        Some(why) => format!("schema: waiting: {why}\n"),
        None => String::new(),
    };
    let body = format!(
        "database: {}\n{schema}listener: {}\n",
        if s.health.db_ok() { "up" } else { "down" },
        if s.health.listener_ok() { "up" } else { "down" }
    );
    if s.health.ready() {
        (StatusCode::OK, body)
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, body)
    }
}

/// Bind `addr` (a `SocketAddr` or a string such as `"127.0.0.1:0"`; fails
/// fast with a clear error if it is taken) and serve until `shutdown`.
/// Returns the bound address (port 0 picks a free one).
pub async fn serve(
    addr: impl tokio::net::ToSocketAddrs + std::fmt::Display,
    handle: PrometheusHandle,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = bind(addr).await?;
    serve_on(listener, handle, health, shutdown)
}

/// Bind the endpoint's address without serving yet, so that a program can
/// find out that the port is taken before its start-up work, and serve
/// later with [`serve_on`].
pub async fn bind(
    addr: impl tokio::net::ToSocketAddrs + std::fmt::Display,
) -> Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| Error::Io {
            context: format!("cannot listen on {addr}"),
            source,
        })
}

/// Serve `/metrics`, `/health` and `/ready` on a bound `listener` until
/// `shutdown`. Returns the bound address.
pub fn serve_on(
    listener: tokio::net::TcpListener,
    handle: PrometheusHandle,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let bound = listener.local_addr().map_err(|source| Error::Io {
        context: "metrics listener".into(),
        source,
    })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/health", get(alive))
        .route("/ready", get(ready))
        .with_state(AppState {
            metrics: handle,
            health,
        });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok((bound, task))
}
