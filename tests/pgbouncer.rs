//! Debian's PgBouncer (1.18) in front of a real PostgreSQL: producers in
//! transaction pooling mode, the worker's claims through PgBouncer in
//! session mode, LISTEN straight to the server (`--listen-database-url`).
//! pgwake sends no startup `options` (PgBouncer's default configuration
//! refuses them). The install step (`.ci/deps`) installs pgbouncer; without
//! it this test fails, it never skips.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::embedded::Cluster;
use common::*;
use pgwake::{Outcome, Worker};

fn pgbouncer_binary() -> PathBuf {
    for p in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        if Path::new(p).is_file() {
            return p.into();
        }
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("pgbouncer"))
            .find(|p| p.is_file())
    });
    found.expect("pgbouncer is not installed: run .ci/deps (apt-get install pgbouncer)")
}

/// A PgBouncer listening only on a Unix socket in its own private
/// directory, with a transaction-mode and a session-mode entry for the
/// cluster's `postgres` database.
struct Bouncer {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Bouncer {
    async fn start(cluster: &Cluster) -> Bouncer {
        let dir = tempfile::Builder::new()
            .prefix("pgwake-pgbouncer-")
            .tempdir()
            .unwrap();
        let port = 6432;
        let target = format!(
            "host={} port={} dbname=postgres user=postgres",
            cluster.socket_dir().display(),
            cluster.port()
        );
        let ini = format!(
            "[databases]\n\
             app_tx = {target} pool_mode=transaction\n\
             app_session = {target} pool_mode=session\n\
             [pgbouncer]\n\
             listen_addr =\n\
             listen_port = {port}\n\
             unix_socket_dir = {dir}\n\
             unix_socket_mode = 0700\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             max_client_conn = 300\n\
             default_pool_size = 40\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            dir = dir.path().display()
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        // PgBouncer refuses to run as root; run it as the cluster's user.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let mut cmd = if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the PgBouncer directory");
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(pgbouncer_binary());
            c
        } else {
            Command::new(pgbouncer_binary())
        };
        let child = cmd
            .arg(dir.path().join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        // The socket file appears at bind(), before listen(): wait until a
        // connection is accepted.
        let socket = dir.path().join(format!(".s.PGSQL.{port}"));
        eventually(
            "pgbouncer accepting connections",
            Duration::from_secs(30),
            || {
                let ready = std::os::unix::net::UnixStream::connect(&socket).is_ok();
                async move { ready }
            },
        )
        .await;
        Bouncer { child, dir, port }
    }

    fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@/{db}?host={}&port={}",
            self.dir.path().display(),
            self.port
        )
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        // runuser forwards the signal to pgbouncer.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_full_workload_through_debian_pgbouncer_loses_nothing() {
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let direct = cluster.url("postgres");
    {
        // migrate goes to the server directly (it holds a session lock).
        let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
            .await
            .unwrap();
        pgwake::schema::migrate(&mut c).await.unwrap();
    }
    let bouncer = Bouncer::start(&cluster).await;
    let producer_url = bouncer.url("app_tx");

    // Producers through transaction pooling: plain SQL (the simple query
    // protocol: no named prepared statements, which PgBouncer 1.18 cannot
    // carry between transactions).
    let producer = pgwake::connect::connect(&pgwake::connect::parse_url(&producer_url).unwrap())
        .await
        .unwrap();
    producer
        .batch_execute(
            "INSERT INTO pgwake.jobs (task, queue) SELECT 'ok', 'q' || (i % 4) FROM generate_series(1, 300) i;
             INSERT INTO pgwake.jobs (task, queue) SELECT 'ok', 'long' FROM generate_series(1, 20) i;
             INSERT INTO pgwake.jobs (task) SELECT 'fail_once' FROM generate_series(1, 20) i;
             INSERT INTO pgwake.jobs (task, max_attempts) SELECT 'doomed', 2 FROM generate_series(1, 5) i;",
        )
        .await
        .unwrap();
    // `pgwake enqueue` (extended protocol) through session pooling.
    let out = pgwake_cmd()
        .env("DATABASE_URL", bouncer.url("app_session"))
        .args(["enqueue", "--task", "ok"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Vec<i64> = {
        let c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
            .await
            .unwrap();
        c.query("SELECT id FROM pgwake.jobs", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    assert_eq!(expected.len(), 346);

    // The worker: claims (both modes) through PgBouncer, LISTEN direct.
    let ledger = Ledger::default();
    let worker = Worker::builder(pgwake::connect::parse_url(&bouncer.url("app_session")).unwrap())
        .listen_database(pgwake::connect::parse_url(&direct).unwrap())
        .config(pgwake::WorkerConfig {
            lease_queues: vec!["long".into()],
            sample_interval: Some(Duration::from_millis(200)),
            ..test_config()
        })
        .handler("ok", ok_handler(&ledger))
        .handler(
            "fail_once",
            Recording {
                ledger: ledger.clone(),
                behaviour: |j: &pgwake::Job| {
                    if j.attempt == 1 {
                        Err("first attempt fails".into())
                    } else {
                        Ok(Outcome::Done)
                    }
                },
            },
        )
        .handler(
            "doomed",
            Recording {
                ledger: ledger.clone(),
                behaviour: |_: &pgwake::Job| Err("always fails".into()),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w
        .next_events(expected.len(), Duration::from_secs(120), |e| {
            matches!(e.outcome(), "done" | "dead")
        })
        .await;
    let dead = events.iter().filter(|e| e.outcome() == "dead").count();
    assert_eq!(dead, 5);
    ledger.check(&expected);
    // A job inserted now, through the transaction pool, wakes the worker
    // through the direct LISTEN.
    w.until_waiting(&TestDb {
        url: direct.clone(),
        name: "postgres".into(),
    })
    .await;
    let rows = producer
        .simple_query("SELECT pgwake.enqueue('ok')")
        .await
        .unwrap();
    let id: i64 = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
            _ => None,
        })
        .unwrap();
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].id, id);
    w.stop.cancel();
    w.join.await.unwrap().unwrap();
    let log = std::fs::read_to_string(bouncer.dir.path().join("pgbouncer.log")).unwrap_or_default();
    assert!(
        !log.contains("unsupported startup parameter"),
        "pgwake sent a startup parameter PgBouncer refuses:\n{log}"
    );
}
