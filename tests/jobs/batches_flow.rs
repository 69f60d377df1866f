//! Batches with a callback (issue 36, item 4; docs/src/flows.md →
//! "Batches"): a callback job that waits for every job of its batch, added
//! over several transactions, and runs once after the last has ended,
//! whatever their outcomes, with a summary (counts by outcome, the failed
//! ids); in both delivery modes, with several workers, and across a kill -9
//! of a worker. The fan-in is counted, not decremented per job: the work of
//! ending 10,000 jobs of one batch in one transaction is counted (rows
//! updated, scans), never timed. (tests/jobs/batches.rs is about the
//! worker's batched writes, not these batches.)

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pgwake::client::{batch_close, batch_open, batch_status, enqueue, BatchStatus, NewJob};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

/// Open a batch whose callback is a job of task `report`.
async fn open(c: &tokio_postgres::Client) -> i64 {
    batch_open(
        c,
        "report",
        &serde_json::json!({"import": 7}),
        None,
        pgwake::client::BATCH_CLOSE_WITHIN_DEFAULT,
    )
    .await
    .unwrap()
}

/// Add `n` jobs of `task` to batch `b`, in one statement.
async fn add(c: &tokio_postgres::Client, b: i64, task: &str, n: i64) -> Vec<i64> {
    c.query(
        "SELECT pgwake.enqueue($1, '{}', batch => $2) FROM generate_series(1, $3::int8)",
        &[&task, &b, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

async fn callback_held(db: &TestDb, b: i64) -> bool {
    let c = db.client().await;
    c.query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&b])
        .await
        .unwrap()
        .get(0)
}

/// Ended jobs (removed, as a done job is) do not release the callback while
/// the batch is open; closing it then releases it in the close's commit;
/// the summary counts them. An empty batch closed is released at once.
/// (Without close_batch's release, the callback stays held after the close.)
#[tokio::test]
async fn closing_after_the_last_job_ended_releases_the_callback_at_once() {
    let db = migrated_db().await;
    let c = db.client().await;
    let b = open(&c).await;
    let jobs = add(&c, b, "t", 3).await;
    c.execute("DELETE FROM pgwake.jobs WHERE id = ANY($1)", &[&jobs])
        .await
        .unwrap();
    assert!(callback_held(&db, b).await, "held while the batch is open");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (
            s.state.as_str(),
            s.callback.as_str(),
            s.total,
            s.done,
            s.pending
        ),
        ("open", "held", 3, 3, 0),
        "{s:?}"
    );
    assert!(batch_close(&c, b).await.unwrap());
    assert!(!callback_held(&db, b).await, "released by the close");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (s.state.as_str(), s.callback.as_str()),
        ("released", "waiting")
    );
    // A second close changes nothing.
    assert!(!batch_close(&c, b).await.unwrap());

    let empty = open(&c).await;
    assert!(batch_close(&c, empty).await.unwrap());
    assert!(
        !callback_held(&db, empty).await,
        "an empty batch closed runs at once"
    );
    let s = batch_status(&c, empty).await.unwrap();
    assert_eq!((s.total, s.state.as_str()), (0, "released"));
}

/// Closed first, the batch's callback is released in the commit that ends
/// its last job, not before; jobs added over several transactions all
/// count. (Without batch_apply's release, the callback stays held.)
#[tokio::test]
async fn closing_before_the_last_job_ended_releases_it_with_the_last() {
    let db = migrated_db().await;
    let mut c = db.client().await;
    let b = open(&c).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let tx = c.transaction().await.unwrap();
        let ids: Vec<i64> = tx
            .query(
                "SELECT pgwake.enqueue('t', '{}', batch => $1) FROM generate_series(1, 4)",
                &[&b],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.commit().await.unwrap();
        jobs.extend(ids);
    }
    assert!(batch_close(&c, b).await.unwrap());
    let (last, rest) = jobs.split_last().unwrap();
    c.execute("DELETE FROM pgwake.jobs WHERE id = ANY($1)", &[&rest])
        .await
        .unwrap();
    assert!(callback_held(&db, b).await, "one job left");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (s.state.as_str(), s.total, s.done, s.pending),
        ("closed", 12, 11, 1)
    );
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[last])
        .await
        .unwrap();
    assert!(!callback_held(&db, b).await, "released with the last");
}

/// Bad input is refused with an error naming the fix, and nothing is
/// added: an unknown batch, a job that is no batch, a closed batch, the
/// 100,001st job (the committed count set near the bound), a close_within
/// out of range. (Without batch_add's bound, the last add succeeds.)
#[tokio::test]
async fn bad_batches_are_refused() {
    let db = migrated_db().await;
    let c = db.client().await;
    let refusal = async |sql: &str| -> String {
        let e = c.batch_execute(sql).await.unwrap_err();
        let db = e.as_db_error().unwrap();
        format!("{} ({})", db.message(), db.hint().unwrap_or(""))
    };
    let e = refusal("SELECT pgwake.enqueue('t', batch => 987654)").await;
    assert!(e.contains("batch 987654 does not exist"), "{e}");
    let plain = enqueue(&c, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let e = refusal(&format!("SELECT pgwake.enqueue('t', batch => {plain})")).await;
    assert!(e.contains(&format!("job {plain} is not a batch")), "{e}");
    let e = batch_status(&c, plain).await.unwrap_err().to_string();
    assert!(e.contains("is not a batch"), "{e}");

    let b = open(&c).await;
    batch_close(&c, b).await.unwrap();
    let e = refusal(&format!("SELECT pgwake.enqueue('t', batch => {b})")).await;
    assert!(e.contains(&format!("batch {b} is closed")), "{e}");
    assert!(e.contains("Open a new batch"), "{e}");

    let b = open(&c).await;
    c.execute(
        "UPDATE pgwake.batches SET added = pgwake.max_batch_jobs() - 1 WHERE id = $1",
        &[&b],
    )
    .await
    .unwrap();
    c.execute("SELECT pgwake.enqueue('t', batch => $1)", &[&b])
        .await
        .unwrap();
    let e = refusal(&format!("SELECT pgwake.enqueue('t', batch => {b})")).await;
    assert!(
        e.contains("has 100000 jobs: at most 100000 are allowed"),
        "{e}"
    );
    let n: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.job_parents WHERE child = {b}"
        ))
        .await;
    assert_eq!(n, 1, "the refused job left nothing");

    let e = refusal("SELECT pgwake.batch_open('r', close_within => interval '0 s')").await;
    assert!(e.contains("close_within"), "{e}");
}

/// A batch whose callback is cancelled: its jobs run on, nothing more can
/// be added, the status says so. A dead batch job retried after the
/// release runs again; the summary the callback was released with stays.
#[tokio::test]
async fn cancelled_callbacks_and_retried_jobs() {
    let db = migrated_db().await;
    let c = db.client().await;
    let b = open(&c).await;
    let jobs = add(&c, b, "t", 2).await;
    let r: String = c
        .query_one("SELECT pgwake.cancel($1)", &[&b])
        .await
        .unwrap()
        .get(0);
    assert_eq!(r, "cancelled", "{r}");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!((s.callback.as_str(), s.pending), ("cancelled", 2));
    let e = c
        .batch_execute(&format!("SELECT pgwake.enqueue('t', batch => {b})"))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("callback was cancelled"), "{e:?}");
    let waiting: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE NOT held")
        .await;
    assert_eq!(waiting, 2, "its jobs still wait to run");

    // Retry of a dead job after the release.
    let b = open(&c).await;
    let jobs2 = add(&c, b, "t", 2).await;
    c.execute(
        "WITH d AS (DELETE FROM pgwake.jobs WHERE id = $1 RETURNING *)
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                                       max_attempts, last_error, created_at)
         SELECT id, queue, task, payload, priority, run_at, 1, 1, 'boom', created_at FROM d",
        &[&jobs2[0]],
    )
    .await
    .unwrap();
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&jobs2[1]])
        .await
        .unwrap();
    batch_close(&c, b).await.unwrap();
    let before = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (before.done, before.dead, before.failed_ids.clone()),
        (1, 1, vec![jobs2[0]])
    );
    let retried = pgwake::admin::dead::retry(
        &c,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![jobs2[0]]),
            queue: None,
            all: false,
        },
    )
    .await
    .unwrap();
    assert_eq!(retried, vec![jobs2[0]]);
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&jobs2[0]])
        .await
        .unwrap();
    let after = batch_status(&c, b).await.unwrap();
    assert_eq!(after, before, "the summary of the release stays");
    let _ = jobs;
}
