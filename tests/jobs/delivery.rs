//! Delivery: wake-ups by NOTIFY, poll-only operation, exactly-once under
//! load, scheduled jobs, transactional enqueue, and listener recovery.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{Worker, WorkerConfig};

#[tokio::test]
async fn a_job_inserted_while_the_worker_idles_runs_because_of_notify() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    // Poll interval one minute: within this test only NOTIFY can explain a pickup.
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            poll_interval: Duration::from_secs(60),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_waiting(&db).await;
    let id = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].id, id);
    assert_eq!(ev[0].outcome(), "done");
    // And again, once it is idle once more.
    w.until_waiting(&db).await;
    let id2 = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].id, id2);
    w.shutdown().await;
    assert_eq!(ledger.check(&[id, id2]), vec![]);
    let left: i64 = db
        .scalar("SELECT count(*) FROM pgwake.waiting_workers")
        .await;
    assert_eq!(left, 0, "a stopped worker removes its registration");
}

#[tokio::test]
async fn poll_only_mode_processes_everything() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    let ids = insert_jobs(&db, "t", 300).await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            listen: false,
            poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.next_events(300, Duration::from_secs(60), |e| e.outcome() == "done")
        .await;
    // Jobs inserted later are found by the poll too.
    let more = insert_jobs(&db, "t", 5).await;
    w.next_events(5, Duration::from_secs(30), |e| e.outcome() == "done")
        .await;
    w.shutdown().await;
    let all: Vec<i64> = ids.into_iter().chain(more).collect();
    assert_eq!(ledger.check(&all), vec![], "no job ran twice");
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn ten_thousand_jobs_at_concurrency_8_batch_50_each_run_exactly_once() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    let ids = insert_jobs(&db, "t", 10_000).await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 8,
            batch: 50,
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let mut w = Running::start(worker);
    w.next_events(10_000, Duration::from_secs(300), |e| e.outcome() == "done")
        .await;
    let took = started.elapsed();
    w.shutdown().await;
    println!("10,000 jobs, concurrency 8, batch 50: {took:?}");
    assert_eq!(ledger.check(&ids), vec![], "no duplicates");
    assert_eq!(ledger.runs().len(), 10_000);
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn a_scheduled_job_never_runs_before_its_run_at_and_does_run_after_it() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            poll_interval: Duration::from_millis(300),
            ..test_config()
        })
        .handler(
            "t",
            Recording {
                ledger: ledger.clone(),
                behaviour: move |job: &pgwake::Job| {
                    seen2
                        .lock()
                        .unwrap()
                        .push((job.id, SystemTime::now(), job.run_at));
                    Ok(pgwake::Outcome::Done)
                },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let client = db.client().await;
    let run_at = SystemTime::now() + Duration::from_secs(2);
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).run_at(run_at),
    )
    .await
    .unwrap();
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].id, id);
    let (_, ran, due) = seen.lock().unwrap()[0];
    assert!(ran >= due, "ran {ran:?} before its run_at {due:?}");
    assert!(ran >= run_at);
    w.shutdown().await;
}

#[tokio::test]
async fn a_job_enqueued_in_a_rolled_back_transaction_never_runs() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            ..test_config()
        })
        .handler("*", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    let ghost = enqueue(&tx, &NewJob::new("ghost", serde_json::json!({})))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let real = enqueue(&tx, &NewJob::new("real", serde_json::json!({})))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The committed job arrives after the rolled-back one would have.
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].id, real);
    w.shutdown().await;
    assert!(!ledger.counts().contains_key(&ghost));
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn listener_killed_with_pg_terminate_backend_reconnects_and_notify_works_again() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            poll_interval: Duration::from_secs(60),
            application_name: "pgwake-kill-test".into(),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let admin = db.client().await;
    let old = listener_pid(&admin, &db.name)
        .await
        .expect("listener session exists");
    let killed: bool = admin
        .query_one("SELECT pg_terminate_backend($1)", &[&old])
        .await
        .unwrap()
        .get(0);
    assert!(killed);
    // Wait for a new listener session to be LISTENing again.
    eventually("a new listener session", Duration::from_secs(30), || {
        let admin = &admin;
        let db = &db;
        let h = w.health.clone();
        async move {
            let pid = listener_pid(admin, &db.name).await;
            h.listener_ok() && pid.is_some() && pid != Some(old)
        }
    })
    .await;
    w.until_waiting(&db).await;
    let id = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].id, id);
    w.shutdown().await;
}

#[tokio::test]
async fn lower_priority_numbers_run_first() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgwake.jobs (task, priority) VALUES ('t', 5), ('t', -1), ('t', 0), ('t', 10)",
        )
        .await
        .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            batch: 1,
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(4, Duration::from_secs(20), |_| true).await;
    w.shutdown().await;
    let order: Vec<i64> = ev.iter().map(|e| e.id).collect();
    // ids 1..4 were inserted with priorities 5, -1, 0, 10.
    assert_eq!(order, vec![2, 3, 1, 4]);
}

#[tokio::test]
async fn queues_flag_restricts_what_a_worker_takes() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mine = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).queue("mine"),
    )
    .await
    .unwrap();
    let theirs = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).queue("theirs"),
    )
    .await
    .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(vec!["mine".into()]),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].id, mine);
    // A second job on `mine` proves the worker kept claiming after `theirs`
    // was skipped.
    let later = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).queue("mine"),
    )
    .await
    .unwrap();
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].id, later);
    w.shutdown().await;
    let left: i64 = client
        .query_one("SELECT id FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, theirs);
}

async fn listener_pid(admin: &tokio_postgres::Client, db: &str) -> Option<i32> {
    admin
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgwake-kill-test-listener' AND datname = $1",
            &[&db],
        )
        .await
        .unwrap()
        .map(|r| r.get::<_, i32>(0))
}

#[tokio::test]
async fn jobs_inserted_while_the_worker_flips_between_draining_and_waiting_are_never_stranded() {
    // Durable commits: the trigger runs a WAL flush before the commit, the
    // window a registration must wait out.
    let (_cluster, db) = private_cluster_db().await;
    let ledger = Ledger::default();
    // No poll to fall back on: every job must be found by a claim that a
    // NOTIFY, a drain or the registration's re-check started.
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            poll_interval: Duration::from_secs(3600),
            concurrency: 2,
            batch: 1,
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_waiting(&db).await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for i in 0..400u64 {
        let id: i64 = client
            .query_one(
                "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
        // Gaps around the registration's 5 ms linger, so the worker keeps
        // crossing between draining (unregistered) and waiting.
        let gap = (i * 7919) % 12;
        tokio::time::sleep(Duration::from_millis(gap)).await;
    }
    w.next_events(400, Duration::from_secs(60), |_| true).await;
    w.shutdown().await;
    assert_eq!(ledger.check(&ids), vec![]);
}
