//! Database outages under a running worker: restarts (fast and immediate),
//! a server down for over 30 s, and a database switched to read-only. The
//! worker never exits or wedges, reports not-ready meanwhile, and every job
//! completes.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::embedded::Cluster;
use common::*;
use pgwake::{Worker, WorkerConfig};

fn outage_worker(db: &TestDb, ledger: &Ledger) -> Worker {
    Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 4,
            batch: 5,
            poll_interval: Duration::from_millis(300),
            reconnect_max: Duration::from_millis(500),
            ..test_config()
        })
        .handler(
            "t",
            Recording {
                ledger: ledger.clone(),
                behaviour: |_: &pgwake::Job| {
                    std::thread::sleep(Duration::from_micros(200));
                    Ok(pgwake::Outcome::Done)
                },
            },
        )
        .build()
        .unwrap()
}

async fn wait_ready(w: &Running, ready: bool) {
    let h = w.health.clone();
    eventually(
        &format!("worker ready = {ready}"),
        Duration::from_secs(60),
        move || {
            let h = h.clone();
            async move { h.ready() == ready }
        },
    )
    .await;
}

async fn restart_under_load(mode: &'static str) {
    let (cluster, db) = private_cluster_db().await;
    let cluster = Arc::new(cluster);
    let ids = insert_jobs(&db, "t", 3000).await;
    let ledger = Ledger::default();
    let mut w = Running::start(outage_worker(&db, &ledger));
    // Restart once a third of the jobs are done, with claims in flight.
    w.next_events(1000, Duration::from_secs(60), |e| e.outcome() == "done")
        .await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.restart(mode))
        .await
        .unwrap()
        .unwrap();
    wait_ready(&w, true).await;
    eventually("every job done", Duration::from_secs(120), || {
        let db = &db;
        async move { remaining(db).await == 0 }
    })
    .await;
    assert!(
        !w.join.is_finished(),
        "the worker kept running through the restart"
    );
    w.shutdown().await;
    let dupes = ledger.check(&ids);
    // Jobs whose outcome had not committed when the server went away ran
    // again; that is the at-least-once contract. They can only be jobs of
    // the claims in flight at the restart: at most concurrency × batch.
    println!(
        "restart -m {mode}: {} jobs ran twice (outcome not committed before the restart)",
        dupes.len()
    );
    assert!(dupes.len() <= 4 * 5, "{dupes:?}");
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
}

#[tokio::test]
async fn restart_fast_with_jobs_in_flight_loses_nothing() {
    restart_under_load("fast").await;
}

#[tokio::test]
async fn restart_immediate_with_jobs_in_flight_loses_nothing() {
    restart_under_load("immediate").await;
}

#[tokio::test]
async fn database_down_for_over_30_seconds_backs_off_reports_not_ready_and_recovers() {
    let (cluster, db) = private_cluster_db().await;
    let cluster: Arc<Cluster> = Arc::new(cluster);
    let ledger = Ledger::default();
    let before = insert_jobs(&db, "t", 10).await;
    let mut w = Running::start(outage_worker(&db, &ledger));
    w.next_events(10, Duration::from_secs(30), |_| true).await;
    wait_ready(&w, true).await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop("fast"))
        .await
        .unwrap()
        .unwrap();
    wait_ready(&w, false).await;
    // The outage itself: 32 s of no database, while the listener and the
    // claim tasks back off and retry.
    tokio::time::sleep(Duration::from_secs(32)).await;
    assert!(!w.join.is_finished(), "the worker survived the outage");
    assert!(!w.health.ready());
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_again())
        .await
        .unwrap()
        .unwrap();
    wait_ready(&w, true).await;
    let after = insert_jobs(&db, "t", 10).await;
    w.next_events(10, Duration::from_secs(60), |e| e.outcome() == "done")
        .await;
    w.shutdown().await;
    let all: Vec<i64> = before.into_iter().chain(after).collect();
    assert_eq!(ledger.check(&all), vec![]);
}

#[tokio::test]
async fn a_database_switched_to_read_only_is_a_reconnect_not_a_job_failure() {
    let (_cluster, db) = private_cluster_db().await;
    let ledger = Ledger::default();
    let mut w = Running::start(outage_worker(&db, &ledger));
    wait_ready(&w, true).await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "ALTER DATABASE postgres SET default_transaction_read_only = on;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name LIKE 'pgwake%' AND pid <> pg_backend_pid();",
        )
        .await
        .unwrap();
    // Jobs arrive while the worker can only read.
    admin
        .batch_execute("SET default_transaction_read_only = off")
        .await
        .unwrap();
    let ids: Vec<i64> = admin
        .query(
            "INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 50) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    wait_ready(&w, false).await;
    assert!(
        ledger.runs().is_empty(),
        "no job ran on a read-only database"
    );
    admin
        .batch_execute("ALTER DATABASE postgres RESET default_transaction_read_only")
        .await
        .unwrap();
    w.next_events(50, Duration::from_secs(60), |e| e.outcome() == "done")
        .await;
    wait_ready(&w, true).await;
    w.shutdown().await;
    assert_eq!(ledger.check(&ids), vec![]);
    let attempts: Vec<i32> = ledger.runs().iter().map(|r| r.1).collect();
    assert!(
        attempts.iter().all(|a| *a == 1),
        "read-only errors used no attempt: {attempts:?}"
    );
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
}
