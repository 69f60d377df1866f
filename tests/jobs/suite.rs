//! The reliability suite: a mixed workload with LISTEN on and off, three
//! worker processes sharing a queue, a completion that fails after the
//! handler succeeded, and a database that kills idle transactions.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, enqueue_many, NewJob};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

/// Fails the first attempt of every third job, for ever jobs whose
/// payload says `dead`.
fn mixed(
    ledger: &Ledger,
) -> Recording<impl Fn(&Job) -> Result<Outcome, BoxError> + Send + Sync + 'static> {
    Recording {
        ledger: ledger.clone(),
        behaviour: |job: &Job| {
            if job.payload["dead"].as_bool() == Some(true) {
                return Err("always fails".into());
            }
            if job.id % 3 == 0 && job.attempt == 1 {
                return Err("first attempt fails".into());
            }
            Ok(Outcome::Done)
        },
    }
}

async fn mixed_workload(listen: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut jobs = Vec::new();
    for i in 0..600 {
        let mut job =
            NewJob::new("t", serde_json::json!({ "i": i, "dead": i % 100 == 0 })).max_attempts(2);
        if i % 10 == 0 {
            job = job.run_at(std::time::SystemTime::now() + Duration::from_millis(500));
        }
        if i % 7 == 0 {
            job = job.queue("other");
        }
        jobs.push(job);
    }
    let ids = enqueue_many(&client, &jobs).await.unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            listen,
            poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler("t", mixed(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    // 600 jobs resolve as done or dead.
    w.next_events(600, Duration::from_secs(120), |e| {
        matches!(e.outcome(), "done" | "dead")
    })
    .await;
    // More arrive while it runs.
    let late = enqueue_many(
        &client,
        &(0..50)
            .map(|i| NewJob::new("t", serde_json::json!({ "late": i })))
            .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    w.next_events(50, Duration::from_secs(60), |e| {
        late.contains(&e.id) && e.outcome() == "done"
    })
    .await;
    w.shutdown().await;
    let all: Vec<i64> = ids.iter().chain(&late).copied().collect();
    let dupes = ledger.check(&all);
    // Jobs that ran twice are exactly the ones whose first attempt failed.
    for (id, n) in &dupes {
        assert_eq!(*n, 2, "job {id} ran {n} times");
        let runs: Vec<i32> = ledger
            .runs()
            .iter()
            .filter(|r| r.0 == *id)
            .map(|r| r.1)
            .collect();
        assert_eq!(runs, vec![1, 2], "job {id}: a retry, not a duplicate");
    }
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 6, "the six always-failing jobs");
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn mixed_workload_with_listen_loses_nothing() {
    mixed_workload(true).await;
}

#[tokio::test]
async fn mixed_workload_poll_only_loses_nothing() {
    mixed_workload(false).await;
}

#[tokio::test]
async fn three_worker_processes_at_concurrency_16_run_10000_jobs_exactly_once() {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let ids = insert_jobs(&db, "work", 10_000).await;
    let workers: Vec<ChaosWorker> = (0..3)
        .map(|_| {
            ChaosWorker::spawn(
                &db,
                &["--concurrency", "16", "--batch", "10", "--sleep-ms", "3"],
            )
        })
        .collect();
    eventually("all 10,000 done", Duration::from_secs(300), || {
        let db = &db;
        async move { remaining(db).await == 0 }
    })
    .await;
    let mut pids = std::collections::HashSet::new();
    for w in workers {
        pids.insert(w.pid());
        assert!(w.terminate().await.success());
    }
    let runs = ledger_runs(&db).await;
    assert_eq!(runs.len(), 10_000, "zero duplicates");
    let ran: std::collections::HashSet<i64> = runs.iter().map(|r| r.0).collect();
    assert_eq!(ran.len(), 10_000, "zero lost");
    assert!(ids.iter().all(|id| ran.contains(id)));
    assert!(runs.iter().all(|r| !r.3), "no overlapping runs");
    let by_worker: std::collections::HashSet<i32> = runs.iter().map(|r| r.2).collect();
    assert_eq!(by_worker, pids, "all three workers took part");
}

/// On its first attempt, kills its own claim connection from another
/// session after doing its work, so the COMMIT of a successful job fails.
struct LoseTheCommit {
    ledger: Ledger,
}

#[async_trait]
impl Handler for LoseTheCommit {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.ledger.record(job);
        let tx = ctx.transaction().await?.unwrap();
        tx.execute(
            "INSERT INTO effects (job_id, attempt) VALUES ($1, $2)",
            &[&job.id, &job.attempt],
        )
        .await?;
        if job.attempt == 1 {
            let pid: i32 = tx.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
            let other = ctx.pool().get().await?;
            other
                .execute("SELECT pg_terminate_backend($1)", &[&pid])
                .await?;
        }
        Ok(Outcome::Done)
    }
}

#[tokio::test]
async fn a_completion_that_fails_after_the_handler_succeeded_runs_the_job_again_never_marks_it_done_unrun(
) {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE effects (job_id bigint, attempt int)")
        .await
        .unwrap();
    let id = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler(
            "t",
            LoseTheCommit {
                ledger: ledger.clone(),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!((ev[0].id, ev[0].attempt, ev[0].outcome()), (id, 2, "done"));
    assert_eq!(
        ledger.runs(),
        vec![(id, 1), (id, 2)],
        "ran again after the lost commit"
    );
    let effects: Vec<i32> = client
        .query("SELECT attempt FROM effects", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        effects,
        vec![2],
        "attempt 1's writes rolled back with its lost commit; attempt 2's committed with the job"
    );
    assert_eq!(remaining(&db).await, 0);
}

struct Sleeps(Duration);

#[async_trait]
impl Handler for Sleeps {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        tokio::time::sleep(self.0).await;
        Ok(Outcome::Done)
    }
}

async fn idle_timeout_one_second_and_a_three_second_job(lease: bool) {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET idle_in_transaction_session_timeout = '1s'",
            db.name
        ))
        .await
        .unwrap();
    let id = insert_jobs(&db, "t", 1).await[0];
    let config = WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        ..test_config()
    };
    let worker = Worker::builder(db.config())
        .config(config)
        .handler("t", Sleeps(Duration::from_secs(3)))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let evs = w.next_events(1, Duration::from_secs(60), |_| true).await;
    w.shutdown().await;
    assert_eq!(
        (evs[0].id, evs[0].attempt, evs[0].outcome()),
        (id, 1, "done"),
        "ran once, to completion"
    );
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn tx_mode_overrides_a_one_second_idle_in_transaction_timeout_for_its_own_claims() {
    idle_timeout_one_second_and_a_three_second_job(false).await;
}

#[tokio::test]
async fn lease_mode_is_unaffected_by_a_one_second_idle_in_transaction_timeout() {
    idle_timeout_one_second_and_a_three_second_job(true).await;
}
