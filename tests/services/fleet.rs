//! The worker registry (`pgwake.workers`): every running worker has a row
//! saying what it serves and how many jobs it runs, gone when it stops and
//! out of `pgwake.live_workers` within 30 s of a kill -9; and the jobs no
//! live worker can run are found (`pgwake.unserved_jobs()`, `pgwake stats`).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};
use tokio::sync::Notify;

/// Holds its job until released.
struct Held(Arc<Notify>);

#[async_trait]
impl Handler for Held {
    async fn handle(&self, _: &Job, _: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.0.notified().await;
        Ok(Outcome::Done)
    }
}

async fn live(client: &tokio_postgres::Client) -> Vec<tokio_postgres::Row> {
    client
        .query(
            "SELECT id, host, pid, version, queues, tasks, handlers::text, concurrency, running \
             FROM pgwake.live_workers ORDER BY id",
            &[],
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn a_running_worker_is_registered_with_what_it_serves_and_removed_when_it_stops() {
    let db = migrated_db().await;
    let client = db.client().await;
    let release = Arc::new(Notify::new());
    insert_jobs(&db, "held", 1).await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(vec!["default".into(), "two words".into()]),
            lease_queues: vec!["slow".into()],
            concurrency: 3,
            ..test_config()
        })
        .handler("held", Held(release.clone()))
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let w = Running::start(worker);
    let row = wait_for(
        "the worker's row, running its job",
        Duration::from_secs(60),
        async || {
            let rows = live(&client).await;
            match rows.first() {
                Some(r) if r.get::<_, i32>(8) == 1 => Ok(rows),
                _ => Err(format!("{rows:?}")),
            }
        },
    )
    .await;
    assert_eq!(row.len(), 1);
    let r = &row[0];
    assert_eq!(r.get::<_, i32>(2), std::process::id() as i32);
    assert_eq!(r.get::<_, String>(3), env!("CARGO_PKG_VERSION"));
    assert_eq!(
        r.get::<_, Option<Vec<String>>>(4),
        Some(vec!["default".into(), "two words".into(), "slow".into()])
    );
    assert_eq!(r.get::<_, Vec<String>>(5), vec!["held", "t"]);
    let handlers: serde_json::Value = serde_json::from_str(&r.get::<_, String>(6)).unwrap();
    assert_eq!(
        handlers,
        serde_json::json!([{"task": "held", "mode": "tx"}, {"task": "t", "mode": "tx"}])
    );
    assert_eq!(r.get::<_, i32>(7), 3);
    assert!(!r.get::<_, String>(1).is_empty());
    release.notify_one();
    w.shutdown().await;
    assert_eq!(live(&client).await.len(), 0, "removed at a clean stop");
    let rows: i64 = db.scalar("SELECT count(*) FROM pgwake.workers").await;
    assert_eq!(rows, 0);
}

/// A worker killed with -9 cannot remove its row: it leaves the live
/// workers when the row expires (30 s after its last renewal).
#[tokio::test]
async fn a_killed_worker_leaves_the_live_workers_within_the_time_to_live() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut child = spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]);
    let pid = child.id() as i32;
    wait_for("the worker's row", Duration::from_secs(60), async || {
        let rows = live(&client).await;
        if rows.iter().any(|r| r.get::<_, i32>(2) == pid) {
            Ok(())
        } else {
            Err(format!("{rows:?}"))
        }
    })
    .await;
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = std::time::Instant::now();
    wait_for("the row to expire", Duration::from_secs(90), async || {
        let rows = live(&client).await;
        if rows.is_empty() {
            Ok(())
        } else {
            Err(format!("{rows:?}"))
        }
    })
    .await;
    // The row stays (for the console's "recently gone"), only not live.
    let rows: i64 = db.scalar("SELECT count(*) FROM pgwake.workers").await;
    assert_eq!(rows, 1);
    println!(
        "a killed worker left the live workers after {:?}",
        killed.elapsed()
    );
}

async fn unserved(client: &tokio_postgres::Client) -> Vec<(String, String, i64)> {
    client
        .query(
            "SELECT queue, task, jobs FROM pgwake.unserved_jobs() ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Jobs of a task no live worker has a handler for, or of a queue no live
/// worker works, are reported by `pgwake.unserved_jobs()` and `pgwake
/// stats` (text and JSON); the ones a live worker serves are not.
#[tokio::test]
async fn jobs_no_live_worker_can_run_are_reported_and_served_ones_are_not() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgwake.jobs (task) VALUES ('t'), ('other'), ('other');
             INSERT INTO pgwake.jobs (task, queue) VALUES ('t', 'elsewhere');
             INSERT INTO pgwake.jobs (task, run_at) VALUES ('later', now() + interval '1 hour');",
        )
        .await
        .unwrap();
    // No live worker: every ready job (not the scheduled one).
    assert_eq!(
        unserved(&client).await,
        vec![
            ("default".into(), "other".into(), 2),
            ("default".into(), "t".into(), 1),
            ("elsewhere".into(), "t".into(), 1),
        ]
    );
    // A worker of queue `default` with a handler for `t`, holding its job.
    let release = Arc::new(Notify::new());
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(vec!["default".into()]),
            ..test_config()
        })
        .handler("t", Held(release.clone()))
        .build()
        .unwrap();
    let w = Running::start(worker);
    wait_for(
        "the worker to register",
        Duration::from_secs(60),
        async || {
            let got = unserved(&client).await;
            if got
                == vec![
                    ("default".into(), "other".into(), 2),
                    ("elsewhere".into(), "t".into(), 1),
                ]
            {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
    let out = run_pgwake(&["stats", "--json"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let of = |queue: &str| {
        stats
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["queue"] == queue)
            .unwrap()["unserved"]
            .clone()
    };
    assert_eq!(of("default")[0]["task"], "other");
    assert_eq!(of("default")[0]["jobs"], 2);
    assert_eq!(of("elsewhere")[0]["task"], "t");
    let out = run_pgwake(&["stats"], Some(&db.url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Waiting for a worker"), "{text}");
    assert!(text.contains("task other  2 job(s)"), "{text}");
    release.notify_one();
    w.shutdown().await;
}
