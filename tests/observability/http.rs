//! HTTP for the observability tests: a plain GET, and a worker's
//! `/metrics`, `/health`, `/ready` endpoint served on a free port.

use std::net::SocketAddr;
use std::time::Duration;

use pgwake::Worker;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use super::common::wait::wait_for;
use super::DEADLINE;

/// A plain HTTP/1.0 GET, so the body runs to the end of the connection
/// (no chunked encoding): (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP GET timed out"))??;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, text.to_string());
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}

/// A worker's HTTP endpoint on a free loopback port.
pub struct Endpoint {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Endpoint {
    pub async fn serve(worker: &Worker) -> Endpoint {
        let stop = CancellationToken::new();
        let (addr, _task) = pgwake::endpoint::serve(
            "127.0.0.1:0",
            pgwake::metrics::install(),
            worker.health(),
            stop.clone(),
        )
        .await
        .unwrap();
        Endpoint { addr, stop }
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).await.unwrap()
    }

    /// Poll `/ready` until it answers `status`; returns the answer.
    pub async fn until_ready(&self, status: u16, what: &str) -> (u16, String) {
        wait_for(
            &format!("/ready to answer {status} ({what})"),
            DEADLINE,
            async || match self.get("/ready").await {
                answer if answer.0 == status => Ok(answer),
                answer => Err(format!("{answer:?}")),
            },
        )
        .await
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
