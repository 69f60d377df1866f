//! Test harness: a real PostgreSQL per test binary (a throwaway cluster
//! started on first use and removed at exit, unless `DATABASE_URL` names a
//! server to use), and a fresh database per test, so tests are isolated and
//! run in parallel.
#![allow(dead_code)]

pub mod process;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

#[allow(unused_imports)]
pub use process::*;

use pgwake::embedded::Cluster;
use pgwake::{
    async_trait, BoxError, Handler, Job, JobContext, JobEvent, Outcome, Worker, WorkerConfig,
};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

static CLUSTER: Mutex<Option<Cluster>> = Mutex::new(None);
static ADMIN_URL: OnceLock<String> = OnceLock::new();
static DB_COUNTER: AtomicU32 = AtomicU32::new(0);

extern "C" fn stop_cluster() {
    if let Ok(mut c) = CLUSTER.lock() {
        if let Some(mut c) = c.take() {
            c.shutdown();
        }
    }
}

/// The URL of a database on the test server that may create databases.
pub fn admin_url() -> &'static str {
    ADMIN_URL.get_or_init(|| {
        if let Ok(url) = std::env::var("DATABASE_URL") {
            return url;
        }
        let cluster = Cluster::start().expect("start a throwaway PostgreSQL for the tests");
        let url = cluster.url("postgres");
        *CLUSTER.lock().unwrap() = Some(cluster);
        // SAFETY: registering a plain extern "C" fn; it runs at process exit.
        unsafe {
            libc::atexit(stop_cluster);
        }
        url
    })
}

/// A fresh database for one test.
pub struct TestDb {
    /// Its URL.
    pub url: String,
    /// Its name.
    pub name: String,
}

impl TestDb {
    /// Parsed connection settings.
    pub fn config(&self) -> tokio_postgres::Config {
        pgwake::connect::parse_url(&self.url).unwrap()
    }

    /// A new connection.
    pub async fn client(&self) -> tokio_postgres::Client {
        pgwake::connect::connect(&self.config()).await.unwrap()
    }

    /// Run a statement and return the first column of the first row.
    pub async fn scalar<T>(&self, sql: &str) -> T
    where
        T: for<'a> tokio_postgres::types::FromSql<'a>,
    {
        self.client()
            .await
            .query_one(sql, &[])
            .await
            .unwrap()
            .get(0)
    }
}

fn db_url(admin: &str, name: &str) -> String {
    let mut cfg: tokio_postgres::Config = admin.parse().unwrap();
    cfg.dbname(name);
    // Rebuild a URL from the parsed parts (admin URLs from DATABASE_URL may
    // carry a password; keep it).
    let host = match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        _ => "127.0.0.1".into(),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres");
    match cfg.get_password() {
        Some(p) => format!(
            "postgres://{user}:{}@{host}:{port}/{name}",
            String::from_utf8_lossy(p)
        ),
        None => format!("postgres://{user}@{host}:{port}/{name}"),
    }
}

/// A fresh, empty database (no pgwake schema).
pub async fn empty_db() -> TestDb {
    let admin = admin_url().to_string();
    let name = format!(
        "pgwake_t{}_{}_{}",
        std::process::id(),
        DB_COUNTER.fetch_add(1, Ordering::Relaxed),
        rand::random::<u32>()
    );
    let client = pgwake::connect::connect(&pgwake::connect::parse_url(&admin).unwrap())
        .await
        .unwrap();
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    TestDb {
        url: db_url(&admin, &name),
        name,
    }
}

/// A fresh database with the pgwake schema.
pub async fn migrated_db() -> TestDb {
    let db = empty_db().await;
    let mut client = db.client().await;
    pgwake::schema::migrate(&mut client).await.unwrap();
    db
}

/// Wait for `cond` to become true, checking on every event of `events` and
/// at least every 50 ms; panics with `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if cond().await {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every run of every job: (job id, attempt), in the order they started.
#[derive(Clone, Default)]
pub struct Ledger {
    runs: Arc<Mutex<Vec<(i64, i32)>>>,
}

impl Ledger {
    /// Record a run.
    pub fn record(&self, job: &Job) {
        self.runs.lock().unwrap().push((job.id, job.attempt));
    }

    /// All runs so far.
    pub fn runs(&self) -> Vec<(i64, i32)> {
        self.runs.lock().unwrap().clone()
    }

    /// Runs per job id.
    pub fn counts(&self) -> HashMap<i64, usize> {
        let mut m = HashMap::new();
        for (id, _) in self.runs() {
            *m.entry(id).or_insert(0) += 1;
        }
        m
    }

    /// The ledger check: every id in `expected` ran at least once, none is
    /// missing; returns the ids that ran more than once (for the caller to
    /// judge against its scenario).
    pub fn check(&self, expected: &[i64]) -> Vec<(i64, usize)> {
        let counts = self.counts();
        let missing: Vec<i64> = expected
            .iter()
            .filter(|id| !counts.contains_key(id))
            .copied()
            .collect();
        assert!(
            missing.is_empty(),
            "{} jobs never ran, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        );
        let mut dupes: Vec<(i64, usize)> = counts.into_iter().filter(|(_, n)| *n > 1).collect();
        dupes.sort();
        dupes
    }
}

/// A handler that records each run and then does what `behaviour` says.
pub struct Recording<F> {
    pub ledger: Ledger,
    pub behaviour: F,
}

#[async_trait]
impl<F> Handler for Recording<F>
where
    F: Fn(&Job) -> Result<Outcome, BoxError> + Send + Sync + 'static,
{
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.ledger.record(job);
        (self.behaviour)(job)
    }
}

/// A recording handler that always succeeds.
pub fn ok_handler(
    ledger: &Ledger,
) -> Recording<impl Fn(&Job) -> Result<Outcome, BoxError> + Send + Sync + 'static> {
    Recording {
        ledger: ledger.clone(),
        behaviour: |_: &Job| Ok(Outcome::Done),
    }
}

/// A config for tests: fast retries and reconnects, a long poll interval
/// unless the test is about polling.
pub fn test_config() -> WorkerConfig {
    WorkerConfig {
        concurrency: 4,
        batch: 10,
        poll_interval: Duration::from_secs(60),
        retry_base: Duration::from_millis(20),
        retry_max: Duration::from_millis(100),
        reconnect_min: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(500),
        grace_period: Duration::from_secs(10),
        sample_interval: None,
        ..WorkerConfig::default()
    }
}

/// A worker running on a background task.
pub struct Running {
    pub stop: CancellationToken,
    pub abort: CancellationToken,
    pub events: broadcast::Receiver<JobEvent>,
    pub health: Arc<pgwake::health::Health>,
    pub join: tokio::task::JoinHandle<pgwake::Result<()>>,
}

impl Running {
    /// Start `worker`.
    pub fn start(worker: Worker) -> Running {
        let stop = CancellationToken::new();
        let abort = CancellationToken::new();
        let events = worker.subscribe();
        let health = worker.health();
        let join = tokio::spawn(worker.run(stop.clone(), abort.clone()));
        Running {
            stop,
            abort,
            events,
            health,
            join,
        }
    }

    /// Wait until the listener is up (and the tasks have been woken once).
    pub async fn until_listening(&self) {
        let h = self.health.clone();
        eventually("listener connected", Duration::from_secs(30), move || {
            let h = h.clone();
            async move { h.listener_ok() }
        })
        .await;
    }

    /// Wait until the listener is up and the worker has registered as
    /// waiting (from then on an insert NOTIFYs it).
    pub async fn until_waiting(&self, db: &TestDb) {
        self.until_listening().await;
        eventually(
            "worker registered as waiting",
            Duration::from_secs(30),
            || async {
                let n: i64 = db
                    .scalar("SELECT count(*) FROM pgwake.waiting_workers WHERE expires_at > now()")
                    .await;
                n > 0
            },
        )
        .await;
    }

    /// Wait for the next `n` events that satisfy `pred`, returning them.
    pub async fn next_events(
        &mut self,
        n: usize,
        timeout: Duration,
        pred: impl Fn(&JobEvent) -> bool,
    ) -> Vec<JobEvent> {
        let mut got = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        while got.len() < n {
            match tokio::time::timeout_at(deadline, self.events.recv()).await {
                Ok(Ok(ev)) => {
                    if pred(&ev) {
                        got.push(ev);
                    }
                }
                Ok(Err(broadcast::error::RecvError::Lagged(k))) => {
                    panic!("event receiver lagged by {k}; raise the channel size")
                }
                Ok(Err(e)) => panic!("event channel closed: {e}"),
                Err(_) => panic!(
                    "timed out after {timeout:?} with {} of {n} events: {got:?}",
                    got.len()
                ),
            }
        }
        got
    }

    /// Stop gracefully and wait for the worker to return.
    pub async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(60), self.join)
            .await
            .expect("worker stops within 60 s")
            .expect("worker task did not panic")
            .expect("worker returned Ok");
    }
}

/// Enqueue `n` jobs of `task` with a plain multi-row INSERT; returns ids.
pub async fn insert_jobs(db: &TestDb, task: &str, n: usize) -> Vec<i64> {
    let client = db.client().await;
    let rows = client
        .query(
            "INSERT INTO pgwake.jobs (task, payload) SELECT $1, jsonb_build_object('n', g) FROM generate_series(1, $2::int) g RETURNING id",
            &[&task, &(n as i32)],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// Rows left in pgwake.jobs.
pub async fn remaining(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pgwake.jobs").await
}

/// A LISTEN session on `pgwake` (and a marker channel) that collects
/// payloads, for counting notifications exactly.
pub struct Notifications {
    pub client: tokio_postgres::Client,
    rx: tokio::sync::mpsc::UnboundedReceiver<(String, String)>,
}

/// Register a stand-in idle worker for every queue, so the insert trigger
/// NOTIFYs (tests that LISTEN by hand).
pub async fn register_waiter(db: &TestDb) {
    db.client()
        .await
        .batch_execute("INSERT INTO pgwake.waiting_workers (worker_id, queues, expires_at) VALUES ('test', NULL, 'infinity')")
        .await
        .unwrap();
}

/// The marker channel: a producer NOTIFYs it after its inserts commit; since
/// notifications arrive in commit order, everything before the marker is
/// everything the inserts sent.
pub const MARKER: &str = "pgwake_test_marker";

impl Notifications {
    pub async fn listen(db: &TestDb) -> Notifications {
        use futures::StreamExt;
        let (client, mut conn) = db.config().connect(tokio_postgres::NoTls).await.unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut s = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
            while let Some(Ok(m)) = s.next().await {
                if let tokio_postgres::AsyncMessage::Notification(n) = m {
                    let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN pgwake; LISTEN {MARKER}"))
            .await
            .unwrap();
        Notifications { client, rx }
    }

    /// Payloads on `pgwake` received before the marker `mark` arrives.
    pub async fn until_marker(&mut self, mark: &str) -> Vec<String> {
        let mut got = Vec::new();
        loop {
            let (channel, payload) = tokio::time::timeout(Duration::from_secs(30), self.rx.recv())
                .await
                .expect("marker arrives")
                .expect("listener alive");
            if channel == MARKER && payload == mark {
                return got;
            }
            if channel == "pgwake" {
                got.push(payload);
            }
        }
    }
}

/// The `chaos_worker` example binary. A plain `cargo test` builds the
/// examples; a run of single test files (`cargo test --test crash`) may not
/// have, so build them here once if they are missing.
pub fn chaos_worker_bin() -> std::path::PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/examples/chaos_worker
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let bin = profile_dir.join("examples").join("chaos_worker");
    BUILT.call_once(|| {
        if bin.exists() && profile_dir.join("examples").join("soak").exists() {
            return;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "--example", "chaos_worker", "--example", "soak"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build --examples");
        assert!(status.success(), "building the examples failed");
    });
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}

/// Create the run ledger the chaos worker writes.
pub async fn create_run_ledger(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE pgwake_runs (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
                                       overlap bool NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .unwrap();
}

/// (job_id, attempt, pid, overlap) rows of the run ledger, in run order.
pub async fn ledger_runs(db: &TestDb) -> Vec<(i64, i32, i32, bool)> {
    db.client()
        .await
        .query(
            "SELECT job_id, attempt, pid, overlap FROM pgwake_runs ORDER BY at, job_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// A chaos worker child process; killed (SIGKILL) on drop if still running.
pub struct ChaosWorker {
    pub child: std::process::Child,
}

impl ChaosWorker {
    pub fn spawn(db: &TestDb, extra: &[&str]) -> ChaosWorker {
        let child = std::process::Command::new(chaos_worker_bin())
            .args(["--database-url", &db.url])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        ChaosWorker { child }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn terminate(mut self) -> std::process::ExitStatus {
        // SAFETY: kill(2) on our own child.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "worker did not exit after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ChaosWorker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// Wait until the run ledger satisfies `cond`.
pub async fn until_runs(
    db: &TestDb,
    what: &str,
    timeout: Duration,
    cond: impl Fn(&[(i64, i32, i32, bool)]) -> bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let runs = ledger_runs(db).await;
        if cond(&runs) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}; runs so far: {runs:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A database on a private throwaway cluster, for tests that restart or stop
/// the server (they must not disturb other tests). Durable commits, as in
/// production: a crash loses nothing that was acknowledged.
pub async fn private_cluster_db() -> (Cluster, TestDb) {
    let options = pgwake::embedded::ClusterOptions {
        durable: true,
        ..Default::default()
    };
    let cluster = tokio::task::spawn_blocking(move || Cluster::start_with(options))
        .await
        .unwrap()
        .unwrap();
    let db = TestDb {
        url: cluster.url("postgres"),
        name: "postgres".into(),
    };
    let mut client = db.client().await;
    pgwake::schema::migrate(&mut client).await.unwrap();
    (cluster, db)
}

/// The `last_error` of dead job `id`.
pub async fn dead_reason(client: &tokio_postgres::Client, id: i64) -> String {
    client
        .query_one(
            "SELECT last_error FROM pgwake.dead_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}
