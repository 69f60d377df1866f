//! Snoozes in both delivery modes: a snoozed job comes back without using
//! an attempt (its workers killed with `kill -9` or not), its snoozes are
//! counted and explained, and a snooze past the bound is a failed attempt.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{Outcome, Worker, WorkerConfig, SNOOZE_MAX};

const LEASE: &[&str] = &["--lease", "--lease-ms", "1500"];

/// Three snoozes, then a run killed with `kill -9`, then a run that ends
/// it, on a job allowed two attempts: the snoozes used none (every run
/// before the kill is attempt 1), the crash used one, the job is done,
/// and three snoozes are counted. A snooze that used an attempt would have
/// killed the job at its second run.
async fn snoozes_use_no_attempt_across_a_kill_9(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new(
            "snooze",
            serde_json::json!({"times": 3, "ms": 20, "block": true}),
        )
        .max_attempts(2),
    )
    .await
    .unwrap();
    let mut a = ChaosWorker::spawn(&db, mode);
    until_runs(
        &db,
        "three snoozes and a fourth run",
        Duration::from_secs(60),
        |r| r.len() >= 4,
    )
    .await;
    let b = ChaosWorker::spawn(&db, mode);
    a.kill9();
    until_drained(&db).await;
    assert!(b.terminate().await.success());
    let runs = ledger_runs(&db).await;
    assert!(runs.iter().all(|r| !r.3), "a run overlapped: {runs:?}");
    let attempts: Vec<i32> = runs.iter().map(|r| r.1).collect();
    assert_eq!(
        attempts,
        vec![1, 1, 1, 1, 2],
        "snoozes use no attempt; the killed run does"
    );
    let dead: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {id}"
        ))
        .await;
    assert_eq!(dead, 0, "the job completed");
    let snoozes: i32 = db
        .scalar(&format!(
            "SELECT snoozes FROM pgwake.job_snoozes WHERE job_id = {id}"
        ))
        .await;
    assert_eq!(snoozes, 3);
}

#[tokio::test]
async fn tx_mode_snoozes_use_no_attempt_across_a_kill_9() {
    snoozes_use_no_attempt_across_a_kill_9(&[]).await;
}

#[tokio::test]
async fn lease_mode_snoozes_use_no_attempt_across_a_kill_9() {
    snoozes_use_no_attempt_across_a_kill_9(LEASE).await;
}

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        ..test_config()
    }
}

/// A job that snoozes for an hour: back in the queue with its attempt
/// given back and its last error kept, its snooze counted, `pgwake
/// explain` says "snoozed until …, the 1st time", `pgwake job show` and
/// `pgwake stats` count it.
async fn a_snoozed_job_waits_and_explain_says_so(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    client
        .execute(
            "UPDATE pgwake.jobs SET last_error = 'earlier failure', attempts = 1 WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "t",
            Recording {
                ledger: ledger.clone(),
                behaviour: |_: &pgwake::Job| Ok(Outcome::snooze(Duration::from_secs(3600))),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w
        .next_events(1, Duration::from_secs(30), |_| true)
        .await
        .remove(0);
    w.shutdown().await;
    assert_eq!((ev.attempt, ev.outcome()), (2, "snoozed"));
    let row = client
        .query_one(
            "SELECT attempts, last_error, run_at > now() + interval '50 minutes',
                    (SELECT snoozes FROM pgwake.job_snoozes WHERE job_id = j.id)
             FROM pgwake.jobs j WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1, "the attempt was given back");
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some("earlier failure")
    );
    assert!(row.get::<_, bool>(2), "due in an hour");
    assert_eq!(row.get::<_, Option<i32>>(3), Some(1));
    let reasons = pgwake::admin::jobs::explain(&client, id).await.unwrap();
    let first = &reasons[0];
    assert_eq!(first.reason, "snoozed", "{reasons:?}");
    assert!(
        first.detail.contains("snoozed until") && first.detail.contains("the 1st time"),
        "{}",
        first.detail
    );
    let shown = pgwake::admin::jobs::show(&client, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        shown.snoozes.map(|s| s.count),
        Some(1),
        "job show counts it"
    );
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let stats = pgwake::admin::stats::read(&pool).await.unwrap();
    let default = stats.iter().find(|s| s.queue == "default").unwrap();
    assert_eq!(
        (default.scheduled, default.snoozed, default.most_snoozes),
        (1, 1, 1),
        "stats counts it"
    );
}

#[tokio::test]
async fn tx_mode_a_snoozed_job_waits_and_explain_says_so() {
    a_snoozed_job_waits_and_explain_says_so(false).await;
}

#[tokio::test]
async fn lease_mode_a_snoozed_job_waits_and_explain_says_so() {
    a_snoozed_job_waits_and_explain_says_so(true).await;
}

/// A snooze of a hundred years is refused: the run is a failed attempt
/// whose error names the bound, retried as any failure.
async fn a_snooze_past_the_bound_is_a_failed_attempt(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "t",
            Recording {
                ledger: ledger.clone(),
                behaviour: |_: &pgwake::Job| {
                    Ok(Outcome::snooze(Duration::from_secs(100 * 365 * 24 * 3600)))
                },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w
        .next_events(1, Duration::from_secs(30), |_| true)
        .await
        .remove(0);
    w.shutdown().await;
    assert_eq!(ev.outcome(), "dead", "its only attempt failed");
    let reason = dead_reason(&client, id).await;
    assert!(
        reason.contains("longer than the longest snooze") && reason.contains("30days"),
        "{reason}"
    );
    assert!(SNOOZE_MAX < Duration::from_secs(100 * 365 * 24 * 3600));
    let counted: i64 = db.scalar("SELECT count(*) FROM pgwake.job_snoozes").await;
    assert_eq!(counted, 0, "a refused snooze is not counted");
}

#[tokio::test]
async fn tx_mode_a_snooze_past_the_bound_is_a_failed_attempt() {
    a_snooze_past_the_bound_is_a_failed_attempt(false).await;
}

#[tokio::test]
async fn lease_mode_a_snooze_past_the_bound_is_a_failed_attempt() {
    a_snooze_past_the_bound_is_a_failed_attempt(true).await;
}

/// The rescuer's round deletes the snooze counts of jobs that are gone a
/// week after their last snooze, and keeps those of jobs still waiting or
/// dead, and recent ones.
#[tokio::test]
async fn snooze_counts_of_gone_jobs_expire_after_a_week() {
    let db = migrated_db().await;
    let client = db.client().await;
    let waiting = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO pgwake.job_snoozes (job_id, snoozes, snoozed_until, snoozed_at) VALUES
                 ($1, 3, now(), now() - interval '8 days'),
                 (-1, 2, now(), now() - interval '8 days'),
                 (-2, 1, now(), now() - interval '1 day')",
            &[&waiting],
        )
        .await
        .unwrap();
    client
        .execute(pgwake::internal::sql::SNOOZES_EXPIRE.text, &[])
        .await
        .unwrap();
    let left: Vec<i64> = client
        .query("SELECT job_id FROM pgwake.job_snoozes ORDER BY job_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec![-2, waiting], "the gone job's old count went");
}
