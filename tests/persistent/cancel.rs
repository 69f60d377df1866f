//! Cancel and timeouts reach the process as a cancel message; a process
//! that does not stop the job within the grace period is killed, and the
//! other jobs it had in flight run again, uncharged. Recycling replaces a
//! process after its jobs without losing one.

use crate::common::*;
use crate::support::*;

use pgwake::client::{enqueue, NewJob};
use serde_json::json;

#[tokio::test]
async fn pgwake_cancel_stops_the_job_in_its_process_which_lives_on() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("sleep", json!({"secs": 600})))
        .await
        .unwrap();
    let mut w = Running::start(worker(
        &db,
        &tag("cancel-lives-on", &python_worker("")),
        &["sleep", "echo"],
        &[],
        options(1),
        history_config(),
    ));
    until_running(&db, id).await;
    let before = tagged("cancel-lives-on");
    pgwake::cancel(&client, id).await.unwrap();
    let ev = w.next_events(1, WAIT, |e| e.id == id).await;
    assert_eq!(ev[0].outcome(), "cancelled");
    // The process answered the cancel: the next job runs on it, not on a
    // replacement started after a kill at the end of the grace period.
    let next = enqueue(&client, &NewJob::new("echo", json!({})))
        .await
        .unwrap();
    w.next_events(1, WAIT, |e| e.id == next).await;
    assert_eq!(tagged("cancel-lives-on"), before, "the same process");
    w.shutdown().await;
}

#[tokio::test]
async fn a_timeout_cancels_the_job_in_its_process() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("sleep", json!({"secs": 600}))
            .timeout(std::time::Duration::from_millis(500))
            .max_attempts(1),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker(
        &db,
        &tag("timeout-cancels", &python_worker("")),
        &["sleep", "echo"],
        &[],
        options(1),
        history_config(),
    ));
    until_running(&db, id).await;
    let before = tagged("timeout-cancels");
    let ev = w.next_events(1, WAIT, |e| e.id == id).await;
    assert_eq!(ev[0].outcome(), "dead");
    assert!(ev[0].error().unwrap().contains("timed out"), "{ev:?}");
    // The process stopped the job on the cancel message: the next job runs
    // on it, not on a replacement started after a kill at the grace's end.
    let next = enqueue(&client, &NewJob::new("echo", json!({})))
        .await
        .unwrap();
    w.next_events(1, WAIT, |e| e.id == next && e.outcome() == "done")
        .await;
    assert_eq!(tagged("timeout-cancels"), before, "the same process");
    w.shutdown().await;
}

#[tokio::test]
async fn a_process_ignoring_a_cancel_is_killed_after_the_grace_and_its_other_job_is_not_charged() {
    let db = migrated_db().await;
    let client = db.client().await;
    let stuck = enqueue(
        &client,
        &NewJob::new("sleep", json!({"secs": 600}))
            .timeout(std::time::Duration::from_millis(300))
            .max_attempts(1),
    )
    .await
    .unwrap();
    let beside = enqueue(
        &client,
        &NewJob::new("sleep", json!({"secs": 4})).max_attempts(1),
    )
    .await
    .unwrap();
    let mut config = history_config();
    config.concurrency = 2;
    let mut w = Running::start(worker(
        &db,
        &quirky("--inflight 2"),
        &["sleep"],
        &[],
        options(1),
        config,
    ));
    let ev = w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    let by_id = |i| ev.iter().find(|e| e.id == i).unwrap();
    assert_eq!(by_id(stuck).outcome(), "dead", "{ev:?}");
    let (outcome, attempts, _, error) = finished(&db, beside).await;
    assert_eq!(
        (outcome.as_str(), attempts),
        ("done", 1),
        "the job beside the stuck one ran again, uncharged: {error:?}"
    );
}

#[tokio::test]
async fn recycled_processes_finish_their_jobs_and_are_replaced() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(
            enqueue(&client, &NewJob::new("pid", json!({})))
                .await
                .unwrap(),
        );
    }
    let mut opts = options(2);
    opts.max_jobs_per_process = Some(3);
    let mut w = Running::start(worker(
        &db,
        &quirky(""),
        &["pid"],
        &[],
        opts,
        history_config(),
    ));
    // (A prefetched job may be handed back, uncharged, and run later.)
    let ev = w.next_events(12, WAIT, |e| e.outcome() != "returned").await;
    w.shutdown().await;
    assert!(
        ev.iter().all(|e| e.outcome() == "done" && e.attempt == 1),
        "{ev:?}"
    );
    let pids: std::collections::HashMap<i64, usize> = {
        let rows = client
            .query(
                "SELECT (result->>'pid')::int8, count(*) FROM pgwake.finished_jobs GROUP BY 1",
                &[],
            )
            .await
            .unwrap();
        rows.iter()
            .map(|r| (r.get(0), r.get::<_, i64>(1) as usize))
            .collect()
    };
    assert!(
        pids.values().all(|&n| n <= 3),
        "no process served more than 3: {pids:?}"
    );
    assert!(pids.len() >= 4, "12 jobs, at most 3 each: {pids:?}");
}

#[tokio::test]
async fn a_process_past_the_memory_bound_is_recycled_after_its_job() {
    let db = migrated_db().await;
    let client = db.client().await;
    let grow = enqueue(&client, &NewJob::new("grow", json!({"mib": 200})))
        .await
        .unwrap();
    let mut opts = options(1);
    opts.max_memory = Some(100 * 1024 * 1024);
    let mut w = Running::start(worker(
        &db,
        &quirky(""),
        &["grow", "pid"],
        &[],
        opts,
        history_config(),
    ));
    w.next_events(1, WAIT, |e| e.id == grow).await;
    let (_, _, result, _) = finished(&db, grow).await;
    let grown = result.unwrap()["pid"].as_i64().unwrap();
    // Recycled: drained, replaced, and the next job runs on the new one.
    eventually("the grown process is gone", WAIT, || async {
        // SAFETY: signal 0 only checks.
        unsafe { libc::kill(grown as i32, 0) != 0 }
    })
    .await;
    let next = enqueue(&client, &NewJob::new("pid", json!({})))
        .await
        .unwrap();
    w.next_events(1, WAIT, |e| e.id == next).await;
    w.shutdown().await;
    let (outcome, _, result, _) = finished(&db, next).await;
    assert_eq!(outcome, "done");
    assert_ne!(result.unwrap()["pid"].as_i64().unwrap(), grown);
}
