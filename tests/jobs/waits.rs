//! Waits that free the slot, in both delivery modes: a job its handler
//! puts to sleep wakes at its time without using an attempt, `pgwake
//! explain` says it is sleeping, and a sleep past the bound is a failed
//! attempt.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{Outcome, Worker, WorkerConfig, SLEEP_MAX};

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

/// A job allowed one attempt sleeps two seconds, then its next run ends
/// it: the sleep used no attempt (the second run is attempt 1 again and
/// the job is done, not found out of attempts), the second run came no
/// sooner than the wake time, and the sleep is recorded.
async fn a_sleeping_job_wakes_at_its_time_without_an_attempt(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let wake = SystemTime::now() + Duration::from_secs(2);
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "t",
            Recording {
                ledger: Ledger::default(),
                behaviour: move |_: &pgwake::Job| {
                    if seen.fetch_add(1, Ordering::SeqCst) == 0 {
                        Ok(Outcome::sleep_until(wake))
                    } else {
                        Ok(Outcome::Done)
                    }
                },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w.next_events(2, Duration::from_secs(60), |_| true).await;
    let woke = SystemTime::now();
    w.shutdown().await;
    let seen: Vec<(i32, &str)> = events.iter().map(|e| (e.attempt, e.outcome())).collect();
    assert_eq!(
        seen,
        vec![(1, "sleeping"), (1, "done")],
        "the sleep used no attempt"
    );
    assert!(woke >= wake, "it ran again only once its wake time came");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let row = client
        .query_one(
            "SELECT kind, waits FROM pgwake.job_waits WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, i32>(1)),
        ("sleep".to_string(), 1)
    );
}

#[tokio::test]
async fn tx_mode_a_sleeping_job_wakes_at_its_time_without_an_attempt() {
    a_sleeping_job_wakes_at_its_time_without_an_attempt(false).await;
}

#[tokio::test]
async fn lease_mode_a_sleeping_job_wakes_at_its_time_without_an_attempt() {
    a_sleeping_job_wakes_at_its_time_without_an_attempt(true).await;
}

/// A job that sleeps for a day: back in the queue due then, with its
/// attempt given back and its last error kept; `pgwake explain` says
/// "sleeping until …" (not "snoozed", not "retry_backoff"); a cancel
/// ends it at once.
async fn a_sleeping_job_waits_and_explain_says_so(lease: bool) {
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
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "t",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &pgwake::Job| {
                    Ok(Outcome::sleep_until(
                        SystemTime::now() + Duration::from_secs(24 * 3600),
                    ))
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
    assert_eq!((ev.attempt, ev.outcome()), (2, "sleeping"));
    let row = client
        .query_one(
            "SELECT attempts, last_error, run_at > now() + interval '23 hours',
                    (SELECT wait_until = j.run_at FROM pgwake.job_waits WHERE job_id = j.id),
                    (SELECT count(*) FROM pgwake.job_snoozes)
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
    assert!(row.get::<_, bool>(2), "due in a day");
    assert_eq!(row.get::<_, Option<bool>>(3), Some(true), "recorded");
    assert_eq!(row.get::<_, i64>(4), 0, "a sleep is not a snooze");
    let reasons = pgwake::admin::jobs::explain(&client, id).await.unwrap();
    let first = &reasons[0];
    assert_eq!(first.reason, "sleeping", "{reasons:?}");
    assert!(
        first.detail.starts_with("sleeping until") && first.detail.contains("1 of 25 used"),
        "{}",
        first.detail
    );
    // A sleeping job is a waiting one: cancelled at once.
    pgwake::cancel(&client, id).await.unwrap();
    assert_eq!(dead_reason(&client, id).await, "cancelled");
    let explained = pgwake::admin::jobs::explain(&client, id).await.unwrap();
    assert_eq!(explained[0].reason, "cancelled", "{explained:?}");
}

#[tokio::test]
async fn tx_mode_a_sleeping_job_waits_and_explain_says_so() {
    a_sleeping_job_waits_and_explain_says_so(false).await;
}

#[tokio::test]
async fn lease_mode_a_sleeping_job_waits_and_explain_says_so() {
    a_sleeping_job_waits_and_explain_says_so(true).await;
}

/// A sleep of a hundred years is refused: the run is a failed attempt
/// whose error names the bound, and nothing is recorded as a wait.
async fn a_sleep_past_the_bound_is_a_failed_attempt(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "t",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &pgwake::Job| {
                    Ok(Outcome::sleep_until(
                        SystemTime::now() + Duration::from_secs(100 * 365 * 24 * 3600),
                    ))
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
        reason.contains("further ahead than the longest sleep") && reason.contains("SLEEP_MAX"),
        "{reason}"
    );
    assert!(SLEEP_MAX < Duration::from_secs(100 * 365 * 24 * 3600));
    let recorded: i64 = db.scalar("SELECT count(*) FROM pgwake.job_waits").await;
    assert_eq!(recorded, 0, "a refused sleep is not recorded");
}

#[tokio::test]
async fn tx_mode_a_sleep_past_the_bound_is_a_failed_attempt() {
    a_sleep_past_the_bound_is_a_failed_attempt(false).await;
}

#[tokio::test]
async fn lease_mode_a_sleep_past_the_bound_is_a_failed_attempt() {
    a_sleep_past_the_bound_is_a_failed_attempt(true).await;
}

/// The rescuer's round deletes the waits of jobs that are gone a week
/// after their last wait, and keeps those of jobs still waiting and recent
/// ones.
#[tokio::test]
async fn waits_of_gone_jobs_expire_after_a_week() {
    let db = migrated_db().await;
    let client = db.client().await;
    let waiting = enqueue(&client, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    client
        .execute(
            "INSERT INTO pgwake.job_waits (job_id, kind, wait_until, waited_at, waits) VALUES
                 ($1, 'sleep', now(), now() - interval '8 days', 1),
                 (-1, 'sleep', now(), now() - interval '8 days', 1),
                 (-2, 'sleep', now(), now() - interval '1 day', 1)",
            &[&waiting],
        )
        .await
        .unwrap();
    client
        .execute(pgwake::internal::sql::WAITS_EXPIRE.text, &[])
        .await
        .unwrap();
    let left: Vec<i64> = client
        .query("SELECT job_id FROM pgwake.job_waits ORDER BY job_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec![-2, waiting], "the gone job's old wait went");
}
