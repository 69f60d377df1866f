//! Shutdown in lease mode and with handlers that ignore cancellation (tx
//! mode's SIGTERM cases are in tests/cli/cli.rs).

use crate::common;

use std::time::{Duration, Instant};

use common::*;

/// Until the worker logs that it stopped claiming (its stop token is
/// cancelled before that line: no slot starts a buffered job after it).
async fn await_shutdown_began(log: &std::sync::Arc<std::sync::Mutex<String>>) {
    eventually(
        "the worker began its shutdown",
        Duration::from_secs(30),
        || {
            let l = log.clone();
            async move { l.lock().unwrap().contains("shutting down: no new claims") }
        },
    )
    .await;
}

#[tokio::test]
async fn lease_mode_sigterm_finishes_in_flight_jobs_and_returns_unstarted_ones() {
    finishes_in_flight_jobs_and_returns_unstarted_ones_on(libc::SIGTERM).await;
}

/// A worker in a terminal that closes (or an ssh session that drops) gets
/// SIGHUP: the same graceful stop as SIGTERM, not an abrupt exit that
/// leaves its leases to expire and charges its buffered jobs.
///
/// Teeth: without SIGHUP in `signals::spawn`, the worker dies of the
/// signal (no exit code) with its two runs cut short.
#[tokio::test]
async fn lease_mode_sighup_stops_as_gracefully_as_sigterm() {
    finishes_in_flight_jobs_and_returns_unstarted_ones_on(libc::SIGHUP).await;
}

/// Two of four lease-mode jobs run (concurrency 2) when the worker gets
/// `signal`: it exits 0 once they finish, the two others untouched.
async fn finishes_in_flight_jobs_and_returns_unstarted_ones_on(signal: i32) {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!(
        "t=exec:sh -c 'touch {d}/$PGWAKE_JOB_ID.started; while [ ! -e {d}/go ]; do sleep 0.02; done; touch {d}/$PGWAKE_JOB_ID.finished'"
    );
    insert_jobs(&db, "t", 4).await;
    let child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--lease-queues",
            "default",
            "--concurrency",
            "2",
        ],
    );
    let p = dir.path().to_path_buf();
    eventually("two jobs running", Duration::from_secs(30), || {
        let p = p.clone();
        async move { count_files(&p, ".started") == 2 }
    })
    .await;
    let mut child = child;
    let log = tail_stderr(&mut child);
    send_signal(&child, signal);
    // The runs end only once the worker has seen the signal: a run that
    // ended before would free its slot for a buffered job.
    await_shutdown_began(&log).await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", log.lock().unwrap());
    assert_eq!(count_files(dir.path(), ".finished"), 2);
    let client = db.client().await;
    let left: Vec<i32> = client
        .query("SELECT attempts FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec![0, 0], "the two unstarted jobs are untouched");
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!(leased, 0, "outcomes written before exit");
}

#[tokio::test]
async fn lease_mode_sigterm_hands_a_full_prefetch_buffer_back_with_attempts_unchanged() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!(
        "t=exec:sh -c 'touch {d}/$PGWAKE_JOB_ID.started; while [ ! -e {d}/go ]; do sleep 0.02; done; touch {d}/$PGWAKE_JOB_ID.finished'"
    );
    insert_jobs(&db, "t", 6).await;
    let child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--lease-queues",
            "default",
            "--concurrency",
            "2",
            "--prefetch",
            "4",
            // The runs are gated: a worker whose slots start nothing for
            // --prefetch-wait (1 s by default) hands its buffer back, and
            // the four buffered jobs would be gone before this test (on a
            // loaded machine) reads them (CI saw it).
            "--prefetch-wait",
            "1h",
        ],
    );
    let p = dir.path().to_path_buf();
    eventually("two jobs running", Duration::from_secs(30), || {
        let p = p.clone();
        async move { count_files(&p, ".started") == 2 }
    })
    .await;
    // The buffer fills: four more jobs leased (charged an attempt each) and
    // waiting for a slot. (Its refill claim may land after the two runs
    // start: CI saw 5 leased when this was read at once.)
    eventually(
        "two running and four prefetched",
        Duration::from_secs(30),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM pgwake.leased_jobs")
                .await
                == 6
        },
    )
    .await;
    let mut child = child;
    let log = tail_stderr(&mut child);
    send_signal(&child, libc::SIGTERM);
    // The runs end only once the worker has seen the signal: a run that
    // ended before would free its slot for a buffered job.
    await_shutdown_began(&log).await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", log.lock().unwrap());
    assert_eq!(
        count_files(dir.path(), ".started"),
        2,
        "no buffered job started"
    );
    assert_eq!(count_files(dir.path(), ".finished"), 2);
    let left: Vec<i32> = db
        .client()
        .await
        .query("SELECT attempts FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        left,
        vec![0; 4],
        "the four prefetched jobs are back at once with their attempt refunded"
    );
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!(leased, 0, "nothing left leased");
}

#[tokio::test]
async fn lease_mode_second_signal_hands_running_jobs_back_with_their_attempt_refunded() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!("t=exec:sh -c 'touch {d}/$PGWAKE_JOB_ID.started; exec sleep 3600'");
    insert_jobs(&db, "t", 2).await;
    let child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--lease-queues",
            "default",
            "--concurrency",
            "2",
            "--grace-period",
            "1h",
        ],
    );
    let p = dir.path().to_path_buf();
    eventually("two jobs running", Duration::from_secs(30), || {
        let p = p.clone();
        async move { count_files(&p, ".started") == 2 }
    })
    .await;
    let mut child = child;
    let log = tail_stderr(&mut child);
    send_signal(&child, libc::SIGTERM);
    // Two signals sent back to back are one to the kernel; send the second
    // once the first was seen.
    let l = log.clone();
    eventually(
        "the first signal was handled",
        Duration::from_secs(30),
        || {
            let l = l.clone();
            async move { l.lock().unwrap().contains("signal received") }
        },
    )
    .await;
    send_signal(&child, libc::SIGTERM);
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", log.lock().unwrap());
    let back: Vec<i32> = db
        .client()
        .await
        .query("SELECT attempts FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(back, vec![0, 0]);
}

#[tokio::test]
async fn a_handler_that_blocks_its_thread_cannot_stop_the_worker_from_exiting() {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let id = insert_jobs(&db, "hog", 1).await[0];
    let w = ChaosWorker::spawn(&db, &["--grace-ms", "300", "--concurrency", "2"]);
    until_runs(&db, "the hog runs", Duration::from_secs(30), |r| {
        r.iter().any(|x| x.0 == id)
    })
    .await;
    let started = Instant::now();
    let status = w.terminate().await;
    let took = started.elapsed();
    // Two documented ways out: the supervisor gives up on the blocked task
    // after the hard deadline and returns (exit 0), or, when the blocked
    // thread happened to hold tokio's timer driver so that the supervisor's
    // own timers never fire (a race in the runtime, seen in about half the
    // runs with a scheduler starting beside it), the watchdog thread exits
    // the process (exit 1). Either way the process is gone, which is the
    // guarantee; a hang would fail `terminate`.
    assert!(
        status.code() == Some(0) || status.code() == Some(1),
        "{status:?}"
    );
    println!("exited {took:?} ({status:?}) after SIGTERM with a thread-blocking handler (grace 300 ms + hard deadline)");
    // The server rolled the claim back when the process died: the job is
    // claimable again (its attempt counted).
    let back: i64 = db
        .scalar(&format!("SELECT count(*) FROM pgwake.jobs WHERE id = {id}"))
        .await;
    assert_eq!(back, 1);
}

#[tokio::test]
async fn a_sql_handler_stuck_in_the_database_is_cancelled_there_and_handed_back_when_the_grace_period_ends(
) {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute("CREATE FUNCTION stuck(p jsonb) RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(3600) $$")
        .await
        .unwrap();
    let id = insert_jobs(&db, "t", 1).await[0];
    let child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            "t=sql:stuck",
            "--grace-period",
            "300ms",
            "--application-name",
            "pgwake-stuck",
        ],
    );
    let client = db.client().await;
    eventually("the function runs", Duration::from_secs(30), || {
        let client = &client;
        async move {
            let n: i64 = client
                .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgwake-stuck' AND query LIKE '%stuck%' AND state = 'active' AND wait_event = 'PgSleep'", &[])
                .await
                .unwrap()
                .get(0);
            n == 1
        }
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let o = wait_exit(child, Duration::from_secs(60)).await;
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    // Its statement is cancelled on the server: handed back, not abandoned
    // at the hard deadline.
    assert!(!stderr.contains("hard deadline"), "{stderr}");
    eventually(
        "the job is back in the queue",
        Duration::from_secs(30),
        || {
            let client = &client;
            async move {
                client
                    .query_opt("SELECT 1 FROM pgwake.jobs WHERE id = $1", &[&id])
                    .await
                    .unwrap()
                    .is_some()
            }
        },
    )
    .await;
}

/// A second signal interrupts a `sql` job stuck on the server: its
/// statement is cancelled there, the job is handed back with its attempt
/// refunded and no crash charge (its batch mark cleared), so a later run
/// is its first attempt again — in the time it takes to cancel, not at the
/// hard deadline.
#[tokio::test]
async fn a_second_signal_cancels_a_stuck_sql_job_on_the_server_and_refunds_its_attempt() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute("CREATE FUNCTION stuck(p jsonb) RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(3600) $$")
        .await
        .unwrap();
    let id = insert_jobs(&db, "t", 1).await[0];
    let child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            "t=sql:stuck",
            "--grace-period",
            "1h",
            "--application-name",
            "pgwake-stuck2",
        ],
    );
    let client = db.client().await;
    let sleeping = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgwake-stuck2' AND query LIKE '%stuck%' AND state = 'active' AND wait_event = 'PgSleep'";
    eventually("the function runs", Duration::from_secs(30), || {
        let client = &client;
        async move {
            client
                .query_one(sleeping, &[])
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        }
    })
    .await;
    let mut child = child;
    let log = tail_stderr(&mut child);
    send_signal(&child, libc::SIGTERM);
    let l = log.clone();
    eventually(
        "the first signal was handled",
        Duration::from_secs(30),
        || {
            let l = l.clone();
            async move { l.lock().unwrap().contains("signal received") }
        },
    )
    .await;
    send_signal(&child, libc::SIGTERM);
    let o = wait_exit(child, Duration::from_secs(60)).await;
    let log = log.lock().unwrap().clone();
    assert_eq!(o.status.code(), Some(0), "{log}");
    assert!(
        !log.contains("hard deadline"),
        "abandoned, not handed back: {log}"
    );
    let n: i64 = client.query_one(sleeping, &[]).await.unwrap().get(0);
    assert_eq!(n, 0, "the statement still runs on the server");
    let attempts: i32 = client
        .query_one("SELECT attempts FROM pgwake.jobs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 0, "the interrupted run is refunded");
    let marks: i64 = client
        .query_one("SELECT count(*) FROM pgwake.tx_batches", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(marks, 0, "no crash charge waits for the job's next run");
}
