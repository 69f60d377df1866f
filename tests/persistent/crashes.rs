//! Crashes: a poison job that kills its process beside good jobs in flight
//! (the good ones run and are not charged), a handler process killed with
//! SIGKILL mid-job, the worker killed with SIGKILL (its processes go with
//! it and another worker finishes the jobs), a process that stops
//! answering, and a database restart.

use crate::common::*;
use crate::support::*;

use pgwake::client::{enqueue, NewJob};
use serde_json::json;

/// One process taking four jobs at once: three good sleeps and a poison
/// job arrive together; the poison job's crash takes the process down
/// with all four in flight.
async fn poison_beside_good_jobs(command: String) {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut good = Vec::new();
    for _ in 0..3 {
        good.push(
            enqueue(&client, &NewJob::new("sleep", json!({"secs": 1.5})))
                .await
                .unwrap(),
        );
    }
    let poison = enqueue(&client, &NewJob::new("crash", json!({})).max_attempts(2))
        .await
        .unwrap();
    let mut config = history_config();
    config.concurrency = 4;
    let mut w = Running::start(worker(
        &db,
        &command,
        &["sleep", "crash"],
        &[],
        options(1),
        config,
    ));
    // The poison job crashes twice (retried after the quick test backoff)
    // and is dead; the good ones are done.
    let ev = w.next_events(5, WAIT, |e| e.outcome() != "returned").await;
    w.shutdown().await;
    for id in &good {
        let (outcome, attempts, _, error) = finished(&db, *id).await;
        assert_eq!(
            (outcome.as_str(), attempts),
            ("done", 1),
            "good job {id} was charged for the poison job's crash: {error:?}; events {ev:?}"
        );
    }
    let (outcome, attempts, _, error) = finished(&db, poison).await;
    assert_eq!((outcome.as_str(), attempts), ("dead", 2), "{ev:?}");
    let error = error.unwrap();
    assert!(
        error.contains("exited (exit status 1)") && error.contains("while running this job"),
        "{error}"
    );
}

#[tokio::test]
async fn a_poison_job_in_a_node_process_charges_only_itself() {
    poison_beside_good_jobs(node_worker("--inflight 4")).await;
}

#[tokio::test]
async fn a_poison_job_in_a_python_process_charges_only_itself() {
    poison_beside_good_jobs(python_worker("--inflight 4")).await;
}

#[tokio::test]
async fn a_handler_process_killed_mid_job_charges_that_job_and_is_replaced() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("sleep", json!({"secs": 600})).max_attempts(1),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker(
        &db,
        &tag("killed-mid-job", &python_worker("")),
        &["sleep", "echo"],
        &[],
        options(1),
        history_config(),
    ));
    until_running(&db, id).await;
    let before = tagged("killed-mid-job");
    assert_eq!(before.len(), 1, "{before:?}");
    // SAFETY: kill(2) on a process this test started.
    unsafe {
        libc::kill(before[0], libc::SIGKILL);
    }
    let ev = w.next_events(1, WAIT, |e| e.id == id).await;
    assert_eq!(ev[0].outcome(), "dead");
    let reason = dead_reason(&client, id).await;
    assert!(
        reason.contains("killed by signal 9") && reason.contains("while running this job"),
        "{reason}"
    );
    // Its replacement serves the next job.
    let next = enqueue(&client, &NewJob::new("echo", json!({"after": "kill"})))
        .await
        .unwrap();
    let ev = w.next_events(1, WAIT, |e| e.id == next).await;
    assert_eq!(ev[0].outcome(), "done");
    let after = tagged("killed-mid-job");
    assert_eq!(after.len(), 1);
    assert_ne!(after, before, "a new process");
    w.shutdown().await;
    assert!(
        tagged("killed-mid-job").is_empty(),
        "the processes stop with the worker"
    );
}

#[tokio::test]
async fn a_process_that_stops_answering_is_killed_and_its_job_runs_again() {
    let db = migrated_db().await;
    let client = db.client().await;
    let marker = tempfile::tempdir().unwrap();
    let marker = marker.path().join("once");
    // SAFETY (of the test): set before any thread reads the environment of
    // the processes it starts; `PGWAKE_EXEC_MARKER` reaches them as MARKER.
    let id = enqueue(&client, &NewJob::new("pid", json!({})).max_attempts(3))
        .await
        .unwrap();
    let command = format!(
        "env MARKER={} {}",
        marker.display(),
        quirky("--mode silent")
    );
    let mut w = Running::start(worker(
        &db,
        &command,
        &["pid"],
        &[],
        options(1),
        history_config(),
    ));
    let ev = w.next_events(2, WAIT, |e| e.id == id).await;
    w.shutdown().await;
    assert_eq!(
        (ev[0].outcome(), ev[1].outcome()),
        ("retry", "done"),
        "{ev:?}"
    );
    let error = ev[0].error().unwrap_or_default().to_owned();
    assert!(error.contains("answered nothing"), "{error}");
}

#[tokio::test]
async fn a_worker_killed_with_sigkill_takes_its_processes_and_another_worker_finishes_the_job() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("sleep", json!({"secs": 600})).max_attempts(5),
    )
    .await
    .unwrap();
    let handler = format!("sleep=persistent:{}", python_worker(""));
    let mut first = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--processes",
            "1",
            "--lease-duration",
            "2s",
            "--rescue-interval",
            "500ms",
        ],
    ));
    until_running(&db, id).await;
    let pid = first.child().id() as i32;
    let processes = children_of(pid);
    assert_eq!(processes.len(), 1, "{processes:?}");
    send_signal(first.child(), libc::SIGKILL);
    first.child().wait().unwrap();
    eventually("the handler process dies with its worker", WAIT, || async {
        // SAFETY: signal 0 only checks.
        unsafe { libc::kill(processes[0], 0) != 0 }
    })
    .await;
    // The lease runs out; a second worker rescues the job and, since this
    // payload would sleep again, we let it fail fast: change the payload.
    client
        .execute(
            "UPDATE pgwake.leased_jobs SET payload = '{\"secs\": 0}' WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    let mut second = Running::start(worker(
        &db,
        &python_worker(""),
        &["sleep"],
        &[],
        options(1),
        history_config(),
    ));
    let ev = second
        .next_events(1, WAIT, |e| e.id == id && e.outcome() == "done")
        .await;
    second.shutdown().await;
    assert_eq!(ev[0].attempt, 2, "{ev:?}");
}

#[tokio::test]
async fn jobs_survive_a_database_restart() {
    let (cluster, db) = private_cluster_db().await;
    let client = db.client().await;
    for i in 0..5 {
        enqueue(&client, &NewJob::new("echo", json!({"i": i})))
            .await
            .unwrap();
    }
    let mut w = Running::start(worker(
        &db,
        &python_worker(""),
        &["echo"],
        &[],
        options(2),
        test_config(),
    ));
    w.next_events(5, WAIT, |e| e.outcome() == "done").await;
    cluster.restart("fast").unwrap();
    let client = db.client().await;
    for i in 5..10 {
        enqueue(&client, &NewJob::new("echo", json!({"i": i})))
            .await
            .unwrap();
    }
    w.next_events(5, WAIT, |e| e.outcome() == "done").await;
    w.shutdown().await;
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn a_process_in_a_crash_loop_is_restarted_with_growing_delays_and_counted() {
    let db = migrated_db().await;
    let client = db.client().await;
    let marker = tempfile::tempdir().unwrap();
    let handler = format!(
        "pid=persistent:env MARKER={} {}",
        marker.path().join("once").display(),
        quirky("--mode crash-loop")
    );
    // The first process starts well; its first job kills it (a plain exit
    // after the job arrives is enough: every later start dies at once).
    let id = enqueue(&client, &NewJob::new("pid", json!({"secs": 600})))
        .await
        .unwrap();
    let mut run = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &["--handler", &handler, "--processes", "1"],
    ));
    let log = tail_stderr(run.child());
    until_running(&db, id).await;
    let first = children_of(run.child().id() as i32);
    assert_eq!(first.len(), 1, "{first:?}");
    // SAFETY: kill(2) on the handler process of the worker this test runs.
    unsafe {
        libc::kill(first[0], libc::SIGKILL);
    }
    // Each restart dies after its hello: the delays double, visibly.
    eventually("three restarts, backing off", WAIT, || {
        let log = log.clone();
        async move {
            log.lock()
                .unwrap()
                .contains("restarting process 0 in 400ms")
        }
    })
    .await;
    send_signal(run.child(), libc::SIGTERM);
    let _ = run.child().wait();
    let log = log.lock().unwrap().clone();
    let delays: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split("restarting process 0 in ").nth(1))
        .filter_map(|rest| rest.split_whitespace().next())
        .collect();
    assert_eq!(&delays[..3], ["100ms", "200ms", "400ms"], "{log}");
}

/// The live child processes of `pid`.
fn children_of(pid: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')').map(|(_, r)| {
                        let f: Vec<&str> = r.split_whitespace().collect();
                        f.first() != Some(&"Z") && f.get(1) == Some(&pid.to_string().as_str())
                    })
                })
                .unwrap_or(false)
        })
        .collect()
}
