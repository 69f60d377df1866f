//! tx-mode outcomes: retry with backoff, dead at max_attempts, panics and
//! timeouts as failures, unknown tasks, and batch isolation.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

fn failing(
    ledger: &Ledger,
) -> Recording<impl Fn(&Job) -> Result<Outcome, BoxError> + Send + Sync + 'static> {
    Recording {
        ledger: ledger.clone(),
        behaviour: |job: &Job| Err(format!("boom on attempt {}", job.attempt).into()),
    }
}

#[tokio::test]
async fn failure_retries_with_backoff_then_goes_dead_at_max_attempts() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({"k": 1})).max_attempts(3),
    )
    .await
    .unwrap();
    let ledger = Ledger::default();
    let retry_base = Duration::from_millis(300);
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            retry_base,
            retry_max: Duration::from_secs(2),
            poll_interval: Duration::from_millis(100),
            ..test_config()
        })
        .handler("t", failing(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let mut times = Vec::new();
    let mut evs = Vec::new();
    for _ in 0..3 {
        let ev = w
            .next_events(1, Duration::from_secs(30), |_| true)
            .await
            .remove(0);
        times.push(Instant::now());
        evs.push(ev);
    }
    w.shutdown().await;
    let kinds: Vec<(i32, &str)> = evs.iter().map(|e| (e.attempt, e.outcome())).collect();
    assert_eq!(kinds, vec![(1, "retry"), (2, "retry"), (3, "dead")]);
    // Equal jitter: attempt n waits at least half of base * 2^(n-1).
    assert!(times[1] - times[0] >= retry_base / 2);
    assert!(times[2] - times[1] >= retry_base);
    let row = client
        .query_one("SELECT attempts, max_attempts, last_error, payload FROM pgwake.dead_jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 3);
    assert_eq!(row.get::<_, i32>(1), 3);
    let last_error: String = row.get(2);
    assert!(last_error.contains("boom on attempt 3"), "{last_error}");
    assert_eq!(
        row.get::<_, serde_json::Value>(3),
        serde_json::json!({"k": 1})
    );
    assert_eq!(remaining(&db).await, 0);
    assert_eq!(ledger.runs(), vec![(id, 1), (id, 2), (id, 3)]);
}

#[tokio::test]
async fn a_failed_attempt_is_written_back_with_attempts_last_error_and_a_future_run_at() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            retry_base: Duration::from_secs(3600),
            retry_max: Duration::from_secs(7200),
            ..test_config()
        })
        .handler("t", failing(&Ledger::default()))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].outcome(), "retry");
    w.shutdown().await;
    let row = client
        .query_one("SELECT attempts, last_error, run_at > now() + interval '25 minutes' FROM pgwake.jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    assert_eq!(row.get::<_, String>(1), "boom on attempt 1");
    assert!(row.get::<_, bool>(2), "backoff of at least half an hour");
}

#[tokio::test]
async fn a_panicking_handler_counts_as_a_failed_attempt() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).max_attempts(2),
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler(
            "t",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &Job| -> Result<Outcome, BoxError> { panic!("handler exploded") },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let evs = w.next_events(2, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!(evs[0].outcome(), "retry");
    assert_eq!(evs[1].outcome(), "dead");
    let err = dead_reason(&client, id).await;
    assert!(err.contains("handler panicked: handler exploded"), "{err}");
}

struct Sleeper(Duration);

#[async_trait]
impl Handler for Sleeper {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        tokio::time::sleep(self.0).await;
        Ok(Outcome::Done)
    }
}

#[tokio::test]
async fn a_handler_past_its_timeout_is_cancelled_and_counts_as_a_failure() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("slow", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_millis(200),
            ..test_config()
        })
        .handler("slow", Sleeper(Duration::from_secs(3600)))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "dead");
    let err = dead_reason(&client, id).await;
    assert!(err.contains("timed out after 200ms"), "{err}");
}

/// Hangs inside the database (pg_sleep) past the timeout: the worker gives
/// up, and statement_timeout frees the server side too.
struct SqlSleeper;

#[async_trait]
impl Handler for SqlSleeper {
    async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        ctx.transaction()
            .await?
            .unwrap()
            .execute("SELECT pg_sleep(3600)", &[])
            .await?;
        Ok(Outcome::Done)
    }
}

#[tokio::test]
async fn a_handler_hung_in_a_query_times_out_and_the_connection_recovers() {
    let db = migrated_db().await;
    let client = db.client().await;
    let hung = enqueue(
        &client,
        &NewJob::new("hang", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_millis(300),
            concurrency: 1,
            ..test_config()
        })
        .handler("hang", SqlSleeper)
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(60), |_| true).await;
    assert_eq!((ev[0].id, ev[0].outcome()), (hung, "dead"));
    // The single claim task is usable again.
    let next = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(60), |_| true).await;
    assert_eq!((ev[0].id, ev[0].outcome()), (next, "done"));
    w.shutdown().await;
}

/// Two fleets on one queue, or a rolling deploy: a worker claims only the
/// tasks it has handlers for. A job of another task is never claimed (not
/// buried, not charged an attempt); it waits for a worker that has a
/// handler, in both delivery modes.
async fn a_job_of_a_task_without_a_handler_waits_for_a_worker_that_has_one(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let other = enqueue(
        &client,
        &NewJob::new("nobody'; DROP TABLE pgwake.jobs; --", serde_json::json!({})),
    )
    .await
    .unwrap();
    let mine = insert_jobs(&db, "t", 3).await;
    let config = || WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        ..test_config()
    };
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(config())
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    // Claim rounds until this worker's own jobs are done: the other task's
    // job is ready the whole time and never taken.
    let mut claimed = 0;
    while claimed < mine.len() {
        let n = worker.claim_once().await.unwrap();
        assert!(n > 0, "a round claimed nothing with jobs of task t ready");
        claimed += n;
    }
    assert_eq!(claimed, mine.len(), "claimed only the jobs of task t");
    assert_eq!(worker.claim_once().await.unwrap(), 0);
    let (attempts, dead): (i32, i64) = {
        let r = client
            .query_one(
                "SELECT (SELECT attempts FROM pgwake.jobs WHERE id = $1), \
                        (SELECT count(*) FROM pgwake.dead_jobs)",
                &[&other],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((attempts, dead), (0, 0), "waiting, not charged, not dead");

    // A worker with a handler for it runs it.
    let ran = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(config())
        .handler("nobody'; DROP TABLE pgwake.jobs; --", ok_handler(&ran))
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 1);
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn a_job_of_a_task_without_a_handler_waits_for_a_worker_that_has_one_tx() {
    a_job_of_a_task_without_a_handler_waits_for_a_worker_that_has_one(false).await;
}

#[tokio::test]
async fn a_job_of_a_task_without_a_handler_waits_for_a_worker_that_has_one_lease() {
    a_job_of_a_task_without_a_handler_waits_for_a_worker_that_has_one(true).await;
}

#[tokio::test]
async fn fail_outcome_goes_dead_at_once_and_retry_after_sets_the_delay() {
    let db = migrated_db().await;
    let client = db.client().await;
    let fail = enqueue(&client, &NewJob::new("fail", serde_json::json!({})))
        .await
        .unwrap();
    let later = enqueue(&client, &NewJob::new("later", serde_json::json!({})))
        .await
        .unwrap();
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler(
            "fail",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &Job| Ok(Outcome::fail("bad input")),
            },
        )
        .handler(
            "later",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &Job| {
                    Ok(Outcome::retry_after(
                        "rate limited",
                        Duration::from_secs(7200),
                    ))
                },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.next_events(2, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    let err = dead_reason(&client, fail).await;
    assert_eq!(err, "bad input");
    let row = client
        .query_one("SELECT run_at BETWEEN now() + interval '119 minutes' AND now() + interval '121 minutes' FROM pgwake.jobs WHERE id = $1", &[&later])
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
}

/// The job ids the handlers wrote to table `results`, in order.
async fn written(client: &tokio_postgres::Client) -> Vec<i64> {
    column(client, "SELECT job_id FROM results ORDER BY 1").await
}

/// The jobs back in the queue after one failed attempt, in id order.
async fn back_after_one_attempt(client: &tokio_postgres::Client) -> Vec<i64> {
    column(
        client,
        "SELECT id FROM pgwake.jobs WHERE attempts = 1 ORDER BY id",
    )
    .await
}

async fn column(client: &tokio_postgres::Client, sql: &str) -> Vec<i64> {
    client
        .query(sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Writes a row through the claim transaction, then fails for odd payloads.
struct WriteThenMaybeFail;

#[async_trait]
impl Handler for WriteThenMaybeFail {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("tx mode");
        tx.execute("INSERT INTO results (job_id) VALUES ($1)", &[&job.id])
            .await?;
        if job.payload["n"].as_i64().unwrap_or(0) % 2 == 1 {
            return Err("odd".into());
        }
        if job.payload["n"].as_i64() == Some(4) {
            // A failing statement aborts the transaction; the savepoint
            // must contain it.
            tx.execute("SELECT 1/0", &[]).await?;
        }
        Ok(Outcome::Done)
    }
}

#[tokio::test]
async fn one_failure_does_not_undo_its_batch_siblings_and_writes_commit_with_the_job() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE results (job_id bigint PRIMARY KEY)")
        .await
        .unwrap();
    let ids = insert_jobs(&db, "w", 10).await; // payload n = 1..10
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            batch: 10,
            retry_base: Duration::from_secs(3600),
            retry_max: Duration::from_secs(3600),
            ..test_config()
        })
        .handler("w", WriteThenMaybeFail)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let evs = w.next_events(10, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    let done: Vec<i64> = evs
        .iter()
        .filter(|e| e.outcome() == "done")
        .map(|e| e.id)
        .collect();
    let mut results = written(&client).await;
    results.sort();
    let mut done_sorted = done.clone();
    done_sorted.sort();
    // n = 2, 6, 8, 10 succeed (4 hits division by zero; odd ones fail).
    assert_eq!(done_sorted.len(), 4);
    assert_eq!(
        results, done_sorted,
        "exactly the successful jobs' writes committed"
    );
    let back = back_after_one_attempt(&client).await;
    assert_eq!(
        back.len(),
        6,
        "the failed ones are back with one attempt used"
    );
    assert!(back.iter().all(|id| ids.contains(id) && !done.contains(id)));
}

/// Writes a row through the claim transaction; `n = 1` then sends a
/// statement that fails, ignores the error and reports success (its
/// transaction is aborted); `n = 2` writes a row and fails.
struct SwallowThenFail;

#[async_trait]
impl Handler for SwallowThenFail {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("tx mode");
        tx.execute("INSERT INTO results (job_id) VALUES ($1)", &[&job.id])
            .await?;
        if job.payload["n"].as_i64() == Some(1) {
            let _ = tx.execute("SELECT 1/0", &[]).await;
            return Ok(Outcome::Done);
        }
        Err("fails after writing".into())
    }
}

/// The job savepoints' releases are sent ahead, their replies read later.
/// Job 1 reports success from an aborted transaction (its release fails);
/// job 2 fails, and the rollback to its savepoint (which job 2 never got)
/// would go back to job 1's and heal the transaction: the batch must still
/// not commit job 1 as done with its write undone.
#[tokio::test]
async fn a_job_reporting_success_from_an_aborted_transaction_is_never_committed_without_its_writes()
{
    success_from_an_aborted_transaction_is_not_committed(2).await;
}

/// The batch's last savepoint is left to the COMMIT (never released on
/// its own): a last job reporting success from a transaction it aborted
/// must still not commit.
#[tokio::test]
async fn a_last_job_reporting_success_from_an_aborted_transaction_is_not_committed() {
    success_from_an_aborted_transaction_is_not_committed(1).await;
}

/// `jobs` jobs of [`SwallowThenFail`] (payload n = 1.., the first swallows
/// its error and reports success) in one claim, one transaction: the batch
/// fails as a whole, no claim commits, nothing is written.
async fn success_from_an_aborted_transaction_is_not_committed(jobs: usize) {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE results (job_id bigint PRIMARY KEY)")
        .await
        .unwrap();
    let ids = insert_jobs(&db, "s", jobs).await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            batch: 10,
            ..test_config()
        })
        .handler("s", SwallowThenFail)
        .build()
        .unwrap();
    let claimed = worker.claim_once().await;
    assert!(claimed.is_err(), "the batch fails as a whole: {claimed:?}");
    let queued = column(&client, "SELECT id FROM pgwake.jobs ORDER BY id").await;
    assert_eq!(queued, ids, "no claim committed");
    let written: i64 = db.scalar("SELECT count(*) FROM results").await;
    assert_eq!(written, 0);
}

/// Writes a row through the claim transaction, then fails for odd payloads.
/// In one batch (one claim, one transaction): the savepoints sent ahead of
/// each handler's first statement keep each failure to its own writes.
#[tokio::test]
async fn in_one_claim_transaction_a_failing_handler_rolls_back_only_its_own_writes() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE results (job_id bigint PRIMARY KEY)")
        .await
        .unwrap();
    let ids = insert_jobs(&db, "w", 6).await; // payload n = 1..6
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            batch: 10,
            retry_base: Duration::from_secs(3600),
            retry_max: Duration::from_secs(3600),
            ..test_config()
        })
        .handler("w", WriteThenMaybeFail)
        .build()
        .unwrap();
    assert_eq!(
        worker.claim_once().await.unwrap(),
        6,
        "one claim of all six"
    );
    let results = written(&client).await;
    // n = 2 and 6 succeed; odd ones fail after writing; 4 hits 1/0.
    assert_eq!(results, vec![ids[1], ids[5]]);
    let back = back_after_one_attempt(&client).await;
    assert_eq!(back, vec![ids[0], ids[2], ids[3], ids[4]]);
}

/// Asks for the claim transaction; sends a write through it only for even
/// payloads, and fails (after asking, sending nothing) for n = 3.
struct AsksForTheTransaction;

#[async_trait]
impl Handler for AsksForTheTransaction {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("tx mode");
        let n = job.payload["n"].as_i64().unwrap_or(0);
        if n % 2 == 0 {
            tx.execute("INSERT INTO results (job_id) VALUES ($1)", &[&job.id])
                .await?;
        }
        if n == 3 {
            return Err("fails without sending anything".into());
        }
        Ok(Outcome::Done)
    }
}

/// A handler that asks for the claim transaction and sends nothing through
/// it costs the server no savepoint: the job's savepoint is taken when the
/// handler first calls the client, sent ahead of that statement. Counted by
/// the server (pg_stat_statements): one claim of six jobs, three of which
/// write, takes three savepoints; the writes commit with their jobs, and a
/// job that asked, sent nothing and failed is retried as any other.
///
/// Teeth: with the savepoint taken when `transaction()` is called (as
/// before), six savepoints.
#[tokio::test]
async fn a_handler_that_asks_for_the_transaction_and_sends_nothing_takes_no_savepoint() {
    let (_cluster, db) =
        private_cluster_db_with(&[("shared_preload_libraries", "pg_stat_statements")]).await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE EXTENSION pg_stat_statements;
             CREATE TABLE results (job_id bigint PRIMARY KEY)",
        )
        .await
        .unwrap();
    let ids = insert_jobs(&db, "asks", 6).await; // payload n = 1..6
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            batch: 10,
            retry_base: Duration::from_secs(3600),
            retry_max: Duration::from_secs(3600),
            ..test_config()
        })
        .handler("asks", AsksForTheTransaction)
        .build()
        .unwrap();
    client
        .batch_execute("SELECT pg_stat_statements_reset()")
        .await
        .unwrap();
    assert_eq!(
        worker.claim_once().await.unwrap(),
        6,
        "one claim of all six"
    );
    let savepoints: i64 = db
        .scalar(
            "SELECT coalesce(sum(calls), 0)::int8 FROM pg_stat_statements
             WHERE query = 'SAVEPOINT pgwake_job'",
        )
        .await;
    assert_eq!(
        savepoints, 3,
        "one savepoint per job that sent a statement through the claim transaction"
    );
    let results = written(&client).await;
    assert_eq!(results, vec![ids[1], ids[3], ids[5]]);
    let back = back_after_one_attempt(&client).await;
    assert_eq!(back, vec![ids[2]], "the failed job is back for a retry");
}
