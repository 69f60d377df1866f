//! A half-open listener connection: traffic black-holed by a proxy (the
//! TCP connection stays open, nothing arrives). The ping times out, the
//! listener reconnects, and the catch-up claim after the reconnect runs the
//! job whose notification was lost.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::{Resolution, Worker, WorkerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A loopback TCP proxy. `blackhole()` silently stops forwarding on every
/// connection open at that moment; later connections work normally.
struct Proxy {
    port: u16,
    cut: Arc<AtomicU64>,
    generation: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicU64::new(0));
        let generation = Arc::new(AtomicU64::new(0));
        let g = generation.clone();
        let c = cut.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    continue;
                };
                let gen = g.fetch_add(1, Ordering::SeqCst) + 1;
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pipe(cr, sw, gen, c.clone()));
                tokio::spawn(pipe(sr, cw, gen, c.clone()));
            }
        });
        Proxy {
            port,
            cut,
            generation,
        }
    }

    /// Connections accepted so far (generations 1..=n) go silent.
    fn blackhole(&self, accepted_so_far: u64) {
        self.cut.store(accepted_so_far, Ordering::SeqCst);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    gen: u64,
    cut: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16384];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if gen <= cut.load(Ordering::SeqCst) {
            // Black hole: keep both sockets open, deliver nothing, ever.
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[tokio::test]
async fn a_black_holed_listener_is_detected_by_ping_reconnects_and_catches_up() {
    let db = migrated_db().await;
    let upstream = db.config().get_ports()[0];
    let proxy = Proxy::start(upstream).await;
    let real = db.config();
    let mut listen_db = tokio_postgres::Config::new();
    listen_db
        .host("127.0.0.1")
        .port(proxy.port)
        .dbname(real.get_dbname().unwrap());
    listen_db.user(real.get_user().unwrap());
    if let Some(pw) = real.get_password() {
        listen_db.password(pw);
    }
    let handle = pgwake::metrics::install();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .listen_database(listen_db)
        .config(WorkerConfig {
            // Only NOTIFY or the reconnect's catch-up claim can explain a pickup.
            poll_interval: Duration::from_secs(600),
            listener_ping_interval: Duration::from_millis(300),
            listener_ping_timeout: Duration::from_millis(300),
            application_name: "pgwake-halfopen".into(),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let sessions = |db: &TestDb| {
        let name = db.name.clone();
        let url = db.url.clone();
        async move {
            let c = pgwake::connect::connect(&pgwake::connect::parse_url(&url).unwrap())
                .await
                .unwrap();
            c.query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgwake-halfopen-listener' AND datname = $1",
                &[&name],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
        }
    };
    assert_eq!(sessions(&db).await, 1);
    let reconnects_before = metric(&handle.render(), "pgwake_listener_reconnects_total");

    proxy.blackhole(proxy.generation.load(Ordering::SeqCst));
    // This job's NOTIFY goes into the black hole.
    let lost = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(
        (ev[0].id, ev[0].resolution),
        (lost, Resolution::Done),
        "the catch-up claim after the reconnect ran it"
    );
    // The old session is still there on the server (half-open), and a new
    // one LISTENs beside it.
    eventually("a second listener session", Duration::from_secs(30), || {
        sessions(&db).await_eq(2)
    })
    .await;
    assert!(metric(&handle.render(), "pgwake_listener_reconnects_total") > reconnects_before);
    // NOTIFY works again through the new connection.
    let next = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].id, next);
    w.shutdown().await;
    assert_eq!(ledger.check(&[lost, next]), vec![]);
}

/// Sum of a metric's samples in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

trait AwaitEq {
    async fn await_eq(self, want: i64) -> bool;
}

impl<F: std::future::Future<Output = i64>> AwaitEq for F {
    async fn await_eq(self, want: i64) -> bool {
        self.await == want
    }
}
