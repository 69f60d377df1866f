//! A half-open listener connection: traffic black-holed by a proxy (the
//! TCP connection stays open, nothing arrives). The ping times out, the
//! listener reconnects, and the catch-up claim after the reconnect runs the
//! job whose notification was lost.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::{Worker, WorkerConfig};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream, UnixStream};

/// A loopback TCP proxy. `blackhole()` silently stops forwarding on every
/// connection open at that moment; later connections work normally.
struct Proxy {
    port: u16,
    cut: Arc<AtomicU64>,
    generation: Arc<AtomicU64>,
}

impl Proxy {
    /// Forward to the server's socket (`upstream`: a Unix socket path, as the
    /// throwaway cluster listens on no TCP port, or `host:port`).
    async fn start(upstream: String) -> Proxy {
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
                let server: Box<dyn Stream> = if upstream.starts_with('/') {
                    match UnixStream::connect(&upstream).await {
                        Ok(s) => Box::new(s),
                        Err(_) => continue,
                    }
                } else {
                    match TcpStream::connect(&upstream).await {
                        Ok(s) => Box::new(s),
                        Err(_) => continue,
                    }
                };
                let gen = g.fetch_add(1, Ordering::SeqCst) + 1;
                let (cr, cw) = tokio::io::split(Box::new(client) as Box<dyn Stream>);
                let (sr, sw) = tokio::io::split(server);
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

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

async fn pipe(
    mut from: ReadHalf<Box<dyn Stream>>,
    mut to: WriteHalf<Box<dyn Stream>>,
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
    let real = db.config();
    let port = real.get_ports()[0];
    let upstream = match &real.get_hosts()[0] {
        tokio_postgres::config::Host::Unix(dir) => {
            dir.join(format!(".s.PGSQL.{port}")).display().to_string()
        }
        tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
    };
    let proxy = Proxy::start(upstream).await;
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
        (ev[0].id, ev[0].outcome()),
        (lost, "done"),
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

/// Blocks until it is stopped; when stopped, sends the wall-clock time.
struct BlocksUntilStopped {
    started: Arc<tokio::sync::Notify>,
    stopped: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<std::time::SystemTime>>>,
}

struct SendOnDrop(Option<tokio::sync::oneshot::Sender<std::time::SystemTime>>);

impl Drop for SendOnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(std::time::SystemTime::now());
        }
    }
}

#[pgwake::async_trait]
impl pgwake::Handler for BlocksUntilStopped {
    async fn handle(
        &self,
        _job: &pgwake::Job,
        _ctx: pgwake::JobContext<'_>,
    ) -> Result<pgwake::Outcome, pgwake::BoxError> {
        let _guard = SendOnDrop(self.stopped.lock().unwrap().take());
        self.started.notify_one();
        std::future::pending::<()>().await;
        Ok(pgwake::Outcome::Done)
    }
}

/// Issue repro: a lease-mode worker cut off from the database kept running
/// its job (a failed heartbeat only warned) while, once the lease expired,
/// another worker could run it too. It must stop the run before its lease
/// ends.
#[tokio::test]
async fn a_lease_worker_cut_off_from_the_database_stops_its_job_before_the_lease_ends() {
    let db = migrated_db().await;
    let real = db.config();
    let port = real.get_ports()[0];
    let upstream = match &real.get_hosts()[0] {
        tokio_postgres::config::Host::Unix(dir) => {
            dir.join(format!(".s.PGSQL.{port}")).display().to_string()
        }
        tokio_postgres::config::Host::Tcp(h) => format!("{h}:{port}"),
    };
    let proxy = Proxy::start(upstream).await;
    let mut via_proxy = tokio_postgres::Config::new();
    via_proxy
        .host("127.0.0.1")
        .port(proxy.port)
        .dbname(real.get_dbname().unwrap());
    via_proxy.user(real.get_user().unwrap());
    if let Some(pw) = real.get_password() {
        via_proxy.password(pw);
    }
    let id = insert_jobs(&db, "t", 1).await[0];
    let started = Arc::new(tokio::sync::Notify::new());
    let (tx, stopped) = tokio::sync::oneshot::channel();
    let worker = Worker::builder(via_proxy)
        .config(WorkerConfig {
            lease_queues: vec!["default".into()],
            lease_duration: Duration::from_secs(3),
            poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler(
            "t",
            BlocksUntilStopped {
                started: started.clone(),
                stopped: std::sync::Mutex::new(Some(tx)),
            },
        )
        .build()
        .unwrap();
    let w = Running::start(worker);
    started.notified().await;
    // Every connection, open or new, goes silent.
    proxy.blackhole(u64::MAX);
    let stopped_at = tokio::time::timeout(Duration::from_secs(60), stopped)
        .await
        .expect("the run was stopped")
        .unwrap();
    let lease_until: std::time::SystemTime = db
        .client()
        .await
        .query_one(
            "SELECT lease_until FROM pgwake.leased_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        stopped_at < lease_until,
        "the run stopped before its lease ended ({stopped_at:?} vs {lease_until:?})"
    );
    w.abort.cancel();
    w.stop.cancel();
    drop(w);
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
