//! Least privilege: non-superuser roles with exactly the documented grants
//! (`pgwake.grant_producer`, `grant_worker`, `grant_monitor`) run a
//! producer, a worker (both delivery modes, retries, dead jobs) and the
//! monitoring commands; each is refused what it was not granted.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::{Outcome, Worker};

/// `db`'s URL and settings as `role` (password `pw`; the throwaway cluster's
/// socket trusts it, an external server may ask for it).
fn as_role(db: &TestDb, role: &str) -> (String, pgwake::connect::DbConfig) {
    let mut cfg = db.config();
    cfg.user(role);
    cfg.password("pw");
    let url = db.url.replacen("://postgres", &format!("://{role}:pw"), 1);
    (url, cfg)
}

async fn roles_db() -> TestDb {
    let db = migrated_db().await;
    let c = db.client().await;
    for role in ["rl_producer", "rl_worker", "rl_monitor"] {
        c.batch_execute(&format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                     CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
                 END IF;
             END $$;
             GRANT CONNECT ON DATABASE {} TO {role};",
            db.name
        ))
        .await
        .unwrap();
    }
    c.batch_execute(
        "SELECT pgwake.grant_producer('rl_producer');
         SELECT pgwake.grant_worker('rl_worker');
         SELECT pgwake.grant_monitor('rl_monitor');",
    )
    .await
    .unwrap();
    db
}

fn denied(e: &tokio_postgres::Error) -> bool {
    e.code().map(|c| c.code()) == Some("42501")
}

#[tokio::test]
async fn a_role_without_grants_is_refused_with_permission_denied() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rl_nobody') THEN
                 CREATE ROLE rl_nobody LOGIN PASSWORD 'pw';
             END IF;
         END $$;",
    )
    .await
    .unwrap();
    let (_, cfg) = as_role(&db, "rl_nobody");
    let nobody = pgwake::connect::connect(&cfg).await.unwrap();
    let e = nobody
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "{e}");
}

#[tokio::test]
async fn producer_worker_and_monitor_roles_work_with_the_documented_grants() {
    let db = roles_db().await;

    // Producer: plain INSERT, pgwake.enqueue(), the CLI; nothing else.
    let (producer_url, producer_cfg) = as_role(&db, "rl_producer");
    let producer = pgwake::connect::connect(&producer_cfg).await.unwrap();
    producer
        .batch_execute(
            "INSERT INTO pgwake.jobs (task) VALUES ('ok');
             SELECT pgwake.enqueue('ok', queue => 'long');
             SELECT pgwake.enqueue('fail_once');
             SELECT pgwake.enqueue('doomed', max_attempts => 1);
             -- Keyed: the second of each key is held behind the first (the
             -- insert trigger reads and updates what a producer may not).
             SELECT pgwake.enqueue('ok', ordering_key => 'rk');
             INSERT INTO pgwake.jobs (task, ordering_key) VALUES ('ok', 'rk');
             SELECT pgwake.enqueue('ok', queue => 'long', ordering_key => 'lk');
             SELECT pgwake.enqueue('ok', queue => 'long', ordering_key => 'lk');",
        )
        .await
        .unwrap();
    let out = pgwake_cmd()
        .env("DATABASE_URL", &producer_url)
        .args(["enqueue", "--task", "ok"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let e = producer
        .execute("DELETE FROM pgwake.jobs", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "a producer must not delete jobs: {e}");
    let e = producer
        .query("SELECT payload FROM pgwake.jobs", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "a producer must not read payloads: {e}");

    // Worker: tx mode, lease mode, a retry, a dead job, and keyed jobs (each
    // key's second job released when the first ends).
    let (_, worker_cfg) = as_role(&db, "rl_worker");
    let worker = Worker::builder(worker_cfg)
        .config(pgwake::WorkerConfig {
            lease_queues: vec!["long".into()],
            sample_interval: Some(Duration::from_millis(200)),
            ..test_config()
        })
        .handler("ok", ok_handler(&Ledger::default()))
        .handler(
            "fail_once",
            Recording {
                ledger: Ledger::default(),
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
                ledger: Ledger::default(),
                behaviour: |_: &pgwake::Job| Err("always fails".into()),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w
        .next_events(9, Duration::from_secs(60), |e| e.outcome() != "retry")
        .await;
    let dead = events.iter().filter(|e| e.outcome() == "dead").count();
    let done = events.iter().filter(|e| e.outcome() == "done").count();
    assert_eq!((done, dead), (8, 1), "{events:?}");
    w.stop.cancel();
    w.join.await.unwrap().unwrap();

    // Monitor: stats and dead list; no writes.
    let (monitor_url, monitor_cfg) = as_role(&db, "rl_monitor");
    for args in [vec!["stats", "--json"], vec!["dead", "list", "--json"]] {
        let out = pgwake_cmd()
            .env("DATABASE_URL", &monitor_url)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pgwake {args:?} as monitor: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let monitor = pgwake::connect::connect(&monitor_cfg).await.unwrap();
    let e = monitor
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "a monitor must not enqueue: {e}");
}

#[tokio::test]
async fn exec_commands_get_an_explicit_environment_without_the_database_secrets() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("env.txt");
    db.client()
        .await
        .batch_execute("SELECT pgwake.enqueue('dump')")
        .await
        .unwrap();
    let handler = format!("dump=exec:sh -c 'env > {}'", out_file.display());
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .env("PGWAKE_LISTEN_DATABASE_URL", &db.url)
        .env("PGPASSWORD", "hunter2")
        .env("PGWAKE_EXEC_API_TOKEN", "t0ken")
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--handler",
            &handler,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = tail_stderr(&mut child);
    wait_files(dir.path(), "env.txt", 1).await;
    eventually("the job is done", Duration::from_secs(30), || async {
        let n: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
        n == 0
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
    let env = std::fs::read_to_string(&out_file).unwrap();
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    for secret in ["DATABASE_URL", "PGWAKE_LISTEN_DATABASE_URL", "PGPASSWORD"] {
        assert!(!names.contains(&secret), "{secret} leaked: {env}");
    }
    assert!(!env.contains("hunter2"), "{env}");
    for expected in ["PATH", "PGWAKE_JOB_ID", "PGWAKE_TASK", "API_TOKEN"] {
        assert!(names.contains(&expected), "{expected} missing: {env}");
    }
    assert!(env.contains("API_TOKEN=t0ken"), "{env}");
}

/// The demo on a user's database runs its own jobs in its own queues
/// (tests/cli/demo.rs shows real jobs stay untouched); jobs an earlier demo
/// left in those queues make it refuse (exit 2), touching none.
#[tokio::test]
async fn demo_refuses_leftover_demo_jobs_and_touches_none() {
    let db = migrated_db().await;
    let id: i64 = db
        .scalar("SELECT pgwake.enqueue('resize_image', queue => 'pgwake-demo')")
        .await;
    let out = pgwake_cmd()
        .args([
            "demo",
            "--database-url",
            &db.url,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("an earlier demo"), "{stderr}");
    let still: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.jobs WHERE id = {id} AND attempts = 0"
        ))
        .await;
    assert_eq!(still, 1);
}
