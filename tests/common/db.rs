//! The test server and a fresh database per test: a throwaway cluster
//! started on first use and removed at exit (unless `DATABASE_URL` names a
//! server to use), databases created on it, and helpers to read and write
//! their rows.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};

use super::embedded::{self, Cluster};

static CLUSTER: Mutex<Option<Cluster>> = Mutex::new(None);
static ADMIN_URL: OnceLock<String> = OnceLock::new();
static DB_COUNTER: AtomicU32 = AtomicU32::new(0);

extern "C" fn stop_cluster() {
    if let Ok(mut c) = CLUSTER.lock() {
        if let Some(mut c) = c.take() {
            c.shutdown_removing_later();
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
    pub fn config(&self) -> pgwake::connect::DbConfig {
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
    let cfg: tokio_postgres::Config = admin.parse().unwrap();
    // Rebuild a URL from the parsed parts (admin URLs from DATABASE_URL may
    // carry a password; keep it). The throwaway cluster is reached through a
    // Unix socket in its private directory.
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let user = cfg.get_user().unwrap_or("postgres");
    let auth = match cfg.get_password() {
        Some(p) => format!("{user}:{}", String::from_utf8_lossy(p)),
        None => user.to_string(),
    };
    match cfg.get_hosts().first() {
        Some(tokio_postgres::config::Host::Unix(dir)) => format!(
            "postgres://{auth}@/{name}?host={}&port={port}",
            dir.display()
        ),
        Some(tokio_postgres::config::Host::Tcp(h)) => {
            format!("postgres://{auth}@{h}:{port}/{name}")
        }
        None => format!("postgres://{auth}@127.0.0.1:{port}/{name}"),
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
    pgwake::admin::schema::migrate(&mut client).await.unwrap();
    db
}

/// A fresh database with the pgwake schema at `version`, as a `pgwake
/// migrate` of that version left it (its migrations applied, not the
/// `functions/` files of this binary).
pub async fn schema_at(version: i32) -> TestDb {
    let db = empty_db().await;
    let c = db.client().await;
    c.batch_execute(
        "CREATE SCHEMA pgwake;
         CREATE TABLE pgwake.schema_migrations (version integer PRIMARY KEY, name text NOT NULL,
                                                applied_at timestamptz NOT NULL DEFAULT now());
         CREATE TABLE pgwake.schema_definitions (name text PRIMARY KEY, sql text NOT NULL,
                                                 applied_at timestamptz NOT NULL DEFAULT now());",
    )
    .await
    .unwrap();
    for m in pgwake::admin::schema::MIGRATIONS
        .iter()
        .filter(|m| m.version <= version)
    {
        c.batch_execute(m.sql).await.unwrap();
        c.execute(
            "INSERT INTO pgwake.schema_migrations (version, name) VALUES ($1, $2)",
            &[&m.version, &m.name],
        )
        .await
        .unwrap();
    }
    db
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

/// Leave what a tx-mode batch of `ids` leaves behind when its worker dies
/// while the batch runs: its mark in `pgwake.tx_batches`, naming a claim
/// transaction that is over (`src/db/sql/batch_mark.sql`). A worker's next
/// claim of any of them runs each alone, as a suspect, charged before it
/// starts (`src/claim/tx/ledger.rs`).
pub async fn mark_as_crashed_batch(db: &TestDb, ids: &[i64]) {
    let c = db.client().await;
    // An autocommit statement that takes an xid: a transaction that is over
    // (a crashed claim's was aborted; neither is 'in progress').
    let xid: String = c
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    c.execute(
        "INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id)
         VALUES ($1::text::xid8, $2, 'a-crashed-worker')",
        &[&xid, &ids],
    )
    .await
    .unwrap();
}

/// Rows left in pgwake.jobs.
pub async fn remaining(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM pgwake.jobs").await
}

/// A database on a private throwaway cluster, for tests that restart or stop
/// the server (they must not disturb other tests). Durable commits, as in
/// production: a crash loses nothing that was acknowledged.
pub async fn private_cluster_db() -> (Cluster, TestDb) {
    private_cluster_db_with(&[]).await
}

/// [`private_cluster_db`] with these server settings besides the defaults
/// (e.g. `shared_preload_libraries`).
pub async fn private_cluster_db_with(settings: &[(&str, &str)]) -> (Cluster, TestDb) {
    let mut options = embedded::ClusterOptions {
        durable: true,
        ..Default::default()
    };
    options.settings.extend(
        settings
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string())),
    );
    let cluster = tokio::task::spawn_blocking(move || Cluster::start_with(options))
        .await
        .unwrap()
        .unwrap();
    let db = TestDb {
        url: cluster.url("postgres"),
        name: "postgres".into(),
    };
    let mut client = db.client().await;
    pgwake::admin::schema::migrate(&mut client).await.unwrap();
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

/// The buffers a statement reads (hits and reads, planning left out), by
/// `EXPLAIN (ANALYZE, BUFFERS)`: the top node's figures include every node
/// under it, CTEs and subplans too.
pub async fn buffers_read(c: &tokio_postgres::Client, statement: &str) -> i64 {
    let row = c
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement}"),
            &[],
        )
        .await
        .unwrap();
    let plan: serde_json::Value = row.get(0);
    let top = &plan[0]["Plan"];
    ["Shared Hit Blocks", "Shared Read Blocks"]
        .iter()
        .map(|k| top[k].as_i64().expect("a buffer count"))
        .sum()
}

/// A session of `db` holding the vacuum horizon, named `application_name`:
/// a REPEATABLE READ transaction that took its snapshot and sits idle.
pub async fn hold_horizon(db: &TestDb, application_name: &str) -> tokio_postgres::Client {
    let pin = connect_as(db, application_name).await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    pin
}

/// While a session holds the horizon: `n` jobs of the default queue, due
/// at `run_at` (an SQL expression), inserted and deleted as claims delete
/// them. Their entries stay at the head of the claim index, none dead to
/// every snapshot, so a read that starts there visits each one's heap tuple.
pub async fn leave_claimed_jobs(c: &tokio_postgres::Client, n: i64, run_at: &str) {
    c.batch_execute(&format!(
        "INSERT INTO pgwake.jobs (task, run_at) SELECT 't', {run_at} FROM generate_series(1, {n});
         DELETE FROM pgwake.jobs;"
    ))
    .await
    .unwrap();
}

/// That `read` walks the claimed jobs' entries a held horizon keeps
/// ([`leave_claimed_jobs`]) once: after one run of it (the session's
/// catalogs and plans), it reads fewer than 1.5 times the buffers of `walk`,
/// a read of the first job past them. Returns the buffers of `read`.
pub async fn assert_walks_once(
    c: &tokio_postgres::Client,
    walk: &str,
    read: &str,
    what: &str,
) -> i64 {
    let walked = buffers_read(c, walk).await;
    assert!(
        walked >= 100,
        "the horizon is held: {walked} buffers to the first job"
    );
    c.batch_execute(read).await.unwrap();
    let buffers = buffers_read(c, read).await;
    eprintln!("one walk of the head: {walked} buffers; {what}: {buffers}");
    assert!(
        buffers < walked * 3 / 2,
        "{what}: the claimed jobs' entries must be walked once, {buffers} buffers against {walked} for one walk"
    );
    buffers
}

/// A connection to `db` with `application_name` set.
pub async fn connect_as(db: &TestDb, application_name: &str) -> tokio_postgres::Client {
    let config = pgwake::connect::with_application_name(&db.config(), application_name);
    pgwake::connect::connect(&config).await.unwrap()
}

/// One tx-mode claim of up to 10 ready jobs of any queue and task, as the
/// worker sends it (`src/db/sql/claim_tx_all.sql`), on `c`: the claimed rows.
/// Inside a transaction the caller opened, the jobs stay claimed until it
/// ends.
pub async fn claim_tx_all(c: &tokio_postgres::Client) -> Vec<tokio_postgres::Row> {
    pgwake::internal::sql::Db::unnamed(c)
        .query(
            &pgwake::internal::sql::CLAIM_TX_ALL,
            &[
                &10i64,
                &Vec::<String>::new(),
                &None::<Vec<String>>,
                &Vec::<String>::new(),
            ],
        )
        .await
        .unwrap()
}

/// One lease-mode claim of up to 10 ready jobs of any queue and task
/// (`src/db/sql/claim_lease_all.sql`) for worker id `worker`, 60 s leases: the
/// claimed rows (column 12 is the claim token).
pub async fn claim_lease_all(c: &tokio_postgres::Client, worker: &str) -> Vec<tokio_postgres::Row> {
    pgwake::internal::sql::Db::unnamed(c)
        .query(
            &pgwake::internal::sql::CLAIM_LEASE_ALL,
            &[
                &10i64,
                &Vec::<String>::new(),
                &None::<Vec<String>>,
                &Vec::<String>::new(),
                &worker.to_string(),
                &60.0f64,
                // every job onto a free slot
                &10i64,
            ],
        )
        .await
        .unwrap()
}

/// Give `queue` a `max_running` limit through the command line, as an
/// operator would (`pgwake queue set QUEUE --max-running N`).
pub fn limit_queue(db: &TestDb, queue: &str, max_running: i32) {
    let n = max_running.to_string();
    let out =
        super::process::run_pgwake(&["queue", "set", queue, "--max-running", &n], Some(&db.url));
    assert!(
        out.status.success(),
        "pgwake queue set {queue} --max-running {n}: {}",
        super::process::stderr_of(&out)
    );
}
