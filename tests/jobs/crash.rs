//! Worker processes killed with `kill -9` in the middle of a job, in both
//! delivery modes: the job runs again, never while its first run is alive,
//! and a job that kills every worker that runs it ends dead.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

async fn killed_mid_job_runs_again_never_concurrently(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("block", serde_json::json!({})).max_attempts(5),
    )
    .await
    .unwrap();
    let mut a = ChaosWorker::spawn(&db, mode);
    until_runs(&db, "attempt 1 running", Duration::from_secs(30), |r| {
        r.iter().any(|x| x.0 == id && x.1 == 1)
    })
    .await;
    // A second worker is already waiting when the first dies: it races for
    // the job as soon as the database gives it back.
    let b = ChaosWorker::spawn(&db, mode);
    a.kill9();
    until_runs(&db, "attempt 2", Duration::from_secs(60), |r| {
        r.iter().any(|x| x.0 == id && x.1 == 2)
    })
    .await;
    let runs = ledger_runs(&db).await;
    assert!(
        runs.iter().all(|r| !r.3),
        "a run overlapped a live earlier run: {runs:?}"
    );
    let attempts: Vec<i32> = runs.iter().map(|r| r.1).collect();
    assert_eq!(attempts, vec![1, 2], "ran again as attempt 2, once");
    assert_ne!(runs[1].2, a.pid(), "the second run is the other worker's");
    assert!(b.terminate().await.success());
    let left: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!((left, leased), (0, 0), "the job completed");
}

#[tokio::test]
async fn tx_mode_job_of_a_killed_worker_runs_again_never_concurrently() {
    killed_mid_job_runs_again_never_concurrently(&[]).await;
}

#[tokio::test]
async fn lease_mode_job_of_a_killed_worker_runs_again_never_concurrently() {
    killed_mid_job_runs_again_never_concurrently(&["--lease", "--lease-ms", "1500"]).await;
}

async fn a_job_that_kills_every_worker_ends_dead(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("poison", serde_json::json!({})).max_attempts(3),
    )
    .await
    .unwrap();
    for attempt in 1..=3 {
        let mut w = ChaosWorker::spawn(&db, mode);
        until_runs(
            &db,
            &format!("attempt {attempt}"),
            Duration::from_secs(60),
            |r| r.iter().any(|x| x.0 == id && x.1 == attempt),
        )
        .await;
        w.kill9();
    }
    let w = ChaosWorker::spawn(&db, mode);
    let reason: String = wait_for(
        "the poison job to reach dead_jobs",
        Duration::from_secs(60),
        async || {
            client
                .query_opt(
                    "SELECT last_error FROM pgwake.dead_jobs WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .map(|row| row.get(0))
                .ok_or_else(|| "not dead yet".to_string())
        },
    )
    .await;
    assert!(w.terminate().await.success());
    let attempts: Vec<i32> = ledger_runs(&db).await.iter().map(|r| r.1).collect();
    assert_eq!(attempts, vec![1, 2, 3], "no fourth run");
    assert!(reason.contains("3"), "{reason}");
}

#[tokio::test]
async fn tx_mode_a_job_that_kills_its_worker_every_time_ends_dead() {
    a_job_that_kills_every_worker_ends_dead(&[]).await;
}

#[tokio::test]
async fn lease_mode_a_job_that_kills_its_worker_every_time_ends_dead() {
    a_job_that_kills_every_worker_ends_dead(&["--lease", "--lease-ms", "1000"]).await;
}

/// A lease worker killed with a full prefetch buffer: the buffered jobs
/// were charged an attempt at claim (the bounded, documented charge) and
/// come back through the rescuer; nothing is lost, each job runs once, and
/// a poison job that kills every worker still ends dead after its attempts.
#[tokio::test]
async fn lease_mode_a_worker_killed_with_a_full_prefetch_buffer_loses_nothing() {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let poison = enqueue(
        &client,
        &NewJob::new("poison", serde_json::json!({})).max_attempts(3),
    )
    .await
    .unwrap();
    let mut work = Vec::new();
    for _ in 0..4 {
        work.push(
            enqueue(
                &client,
                &NewJob::new("work", serde_json::json!({})).max_attempts(10),
            )
            .await
            .unwrap(),
        );
    }
    let mode = [
        "--lease",
        "--lease-ms",
        "1000",
        "--concurrency",
        "1",
        "--prefetch",
        "4",
        // The poison run holds the one slot: with nothing started for
        // --prefetch-wait (1 s by default) the buffer would be handed back
        // before the check below on a loaded machine.
        "--prefetch-wait-ms",
        "3600000",
    ];
    for attempt in 1..=3 {
        let mut w = ChaosWorker::spawn(&db, &mode);
        until_runs(
            &db,
            &format!("poison attempt {attempt}"),
            Duration::from_secs(60),
            |r| r.iter().any(|x| x.0 == poison && x.1 == attempt),
        )
        .await;
        if attempt == 1 {
            // The poison job holds the one slot; the other four wait in the
            // buffer, leased.
            let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
            assert_eq!(leased, 5, "one running, four prefetched");
        }
        w.kill9();
    }
    let w = ChaosWorker::spawn(&db, &mode);
    wait_for(
        "the poison job dead and every other job done",
        Duration::from_secs(60),
        async || {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs),
                            EXISTS (SELECT 1 FROM pgwake.dead_jobs WHERE id = $1)",
                    &[&poison],
                )
                .await
                .unwrap();
            let (left, dead): (i64, bool) = (row.get(0), row.get(1));
            (left == 0 && dead)
                .then_some(())
                .ok_or_else(|| format!("{left} left, poison dead: {dead}"))
        },
    )
    .await;
    assert!(w.terminate().await.success());
    let runs = ledger_runs(&db).await;
    let poison_runs: Vec<i32> = runs.iter().filter(|r| r.0 == poison).map(|r| r.1).collect();
    assert_eq!(
        poison_runs,
        vec![1, 2, 3],
        "no fourth run of the poison job"
    );
    for id in &work {
        let n = runs.iter().filter(|r| r.0 == *id).count();
        assert_eq!(n, 1, "job {id} ran {n} times: {runs:?}");
    }
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 1, "only the poison job is dead");
}
