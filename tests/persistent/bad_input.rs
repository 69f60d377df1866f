//! Bad input, through the `pgwake` binary: a command that is not found,
//! exits at once, speaks another version or never says hello stops
//! `pgwake run` at start-up with the reason (exit 2); a process that
//! breaks the protocol (garbage, a flood, an unknown message, a reply for a
//! job it never got, a second reply) is replaced with an error naming the
//! cause, and no job is lost or finished twice; a stale token is refused
//! and logged. What a process prints reaches the log, tagged with its job.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use crate::support::*;

use pgwake::client::{enqueue, NewJob};
use serde_json::json;

/// `pgwake run` with `handler`, one process, expected to stop at start-up:
/// its exit status and stderr.
async fn refused_at_start(handler: &str, extra: &[&str]) -> (i32, String) {
    let db = migrated_db().await;
    let mut args = vec!["--handler", handler, "--processes", "1"];
    args.extend_from_slice(extra);
    let out = wait_exit(spawn_pgwake_run(&db.url, &args), WAIT).await;
    (out.status.code().unwrap_or(-1), stderr_of(&out))
}

#[tokio::test]
async fn a_command_not_found_stops_the_start_with_the_reason() {
    let (code, err) = refused_at_start("t=persistent:no-such-handler-binary --x", &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("\"no-such-handler-binary\" not found"),
        "{err}"
    );
}

#[tokio::test]
async fn a_command_that_exits_at_once_stops_the_start_with_its_stderr() {
    let (code, err) = refused_at_start(
        &format!("t=persistent:{}", quirky("--mode exit-at-once")),
        &[],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("exited before its hello: exit status 3"),
        "{err}"
    );
    assert!(err.contains("no module named 'app'"), "{err}");
}

#[tokio::test]
async fn a_version_mismatch_stops_the_start_naming_both_versions() {
    let (code, err) =
        refused_at_start(&format!("t=persistent:{}", quirky("--mode version2")), &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("speaks protocol version 2, and this pgwake speaks version 1"),
        "{err}"
    );
}

#[tokio::test]
async fn a_process_that_never_says_hello_stops_the_start_after_the_timeout() {
    let (code, err) = refused_at_start(
        &format!("t=persistent:{}", quirky("--mode no-hello")),
        &["--process-start-timeout", "1s"],
    )
    .await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("no hello within 1s"), "{err}");
}

#[tokio::test]
async fn a_task_the_processes_do_not_serve_stops_the_start() {
    let (code, err) =
        refused_at_start(&format!("resize=persistent:{}", python_worker("")), &[]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not task \"resize\""), "{err}");
}

/// Run one `pid` job on a quirky process that misbehaves once (`mode`),
/// through `pgwake run`: the job's outcome and attempts, and the log.
async fn misbehaving_once(mode: &str) -> (String, i32, String) {
    let db = migrated_db().await;
    let client = db.client().await;
    let marker = tempfile::tempdir().unwrap();
    let handler = format!(
        "pid=persistent:env MARKER={} {}",
        marker.path().join("once").display(),
        quirky(&format!("--mode {mode}"))
    );
    let id = enqueue(&client, &NewJob::new("pid", json!({})).max_attempts(3))
        .await
        .unwrap();
    let mut run = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--processes",
            "1",
            "--keep-finished",
            "1h",
            "--protocol-line-max",
            "65536",
            "--retry-base",
            "10ms",
        ],
    ));
    let log = tail_stderr(run.child());
    eventually("the job is finished", WAIT, || async {
        let n: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.finished_jobs WHERE id = {id}"
            ))
            .await;
        n == 1
    })
    .await;
    send_signal(run.child(), libc::SIGTERM);
    let _ = run.child().wait();
    let (outcome, attempts, _, _) = finished(&db, id).await;
    let log = log.lock().unwrap().clone();
    (outcome, attempts, log)
}

async fn replaced_for(mode: &str, cause: &str) {
    let (outcome, attempts, log) = misbehaving_once(mode).await;
    assert_eq!(outcome, "done", "{log}");
    assert!(
        attempts <= 2,
        "charged at most the run it broke: {attempts}\n{log}"
    );
    assert!(
        log.contains("protocol error") && log.contains(cause),
        "{cause:?} not in:\n{log}"
    );
    assert!(log.contains("restarting process 0"), "{log}");
}

#[tokio::test]
async fn garbage_on_the_protocol_descriptor_replaces_the_process() {
    replaced_for("garbage", "not a JSON protocol message").await;
}

#[tokio::test]
async fn a_flood_past_the_line_limit_replaces_the_process() {
    replaced_for("flood", "wrote a line longer than 65536 bytes").await;
}

#[tokio::test]
async fn an_unknown_message_type_replaces_the_process() {
    replaced_for("unknown-type", "unknown message type \"launch\"").await;
}

#[tokio::test]
async fn a_reply_for_a_job_never_given_replaces_the_process() {
    replaced_for("never-given", "which was never given to it").await;
}

#[tokio::test]
async fn a_second_reply_replaces_the_process_and_the_job_is_done_once() {
    let (outcome, attempts, log) = misbehaving_once("duplicate").await;
    assert_eq!((outcome.as_str(), attempts), ("done", 1), "{log}");
    assert!(
        log.contains("answered job") && log.contains("twice"),
        "{log}"
    );
}

#[tokio::test]
async fn a_stale_token_is_refused_and_logged_and_the_real_answer_counts() {
    let (outcome, attempts, log) = misbehaving_once("stale").await;
    assert_eq!((outcome.as_str(), attempts), ("done", 1), "{log}");
    assert!(log.contains("refused a reply with a stale token"), "{log}");
    assert!(
        !log.contains("protocol error"),
        "a stale token is not fatal:\n{log}"
    );
}

/// `pgwake run` serving `echo` with the reference Python worker on one
/// process, once every job enqueued is done: the run and its log so far.
async fn echo_on_one_process(db: &TestDb) -> (KillOnDrop, Arc<Mutex<String>>) {
    let handler = format!("echo=persistent:{}", python_worker(""));
    let mut run = KillOnDrop::new(spawn_pgwake_run(
        &db.url,
        &["--handler", &handler, "--processes", "1"],
    ));
    let log = tail_stderr(run.child());
    eventually("the jobs are done", WAIT, || async {
        remaining(db).await == 0
    })
    .await;
    (run, log)
}

#[tokio::test]
async fn what_a_process_prints_reaches_the_log_tagged_with_its_job() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("echo", json!({"hi": "\u{1b}[31mred"})),
    )
    .await
    .unwrap();
    let (mut run, log) = echo_on_one_process(&db).await;
    let line = format!("echo {id} on stderr");
    eventually("the lines are logged", Duration::from_secs(10), || {
        let log = log.clone();
        let line = line.clone();
        async move { log.lock().unwrap().contains(&line) }
    })
    .await;
    send_signal(run.child(), libc::SIGTERM);
    let _ = run.child().wait();
    let log = log.lock().unwrap().clone();
    let tagged = |needle: &str| {
        log.lines()
            .any(|l| l.contains(needle) && l.contains(&format!("job={id}")))
    };
    assert!(tagged(&format!("echo {id} on stderr")), "{log}");
    assert!(
        tagged(&format!("echo {id}")) && log.contains("stream=\"stdout\""),
        "{log}"
    );
}

/// A process that prints, then answers, then gets its next job at once:
/// each line is still tagged with the job that printed it, never with the
/// next one (the lines and the answer come on different pipes; the lines
/// written before an answer are read before the job is let go).
#[tokio::test]
async fn each_line_is_tagged_with_the_job_that_printed_it_while_jobs_follow_at_once() {
    let db = migrated_db().await;
    let client = db.client().await;
    const JOBS: usize = 150;
    for _ in 0..JOBS {
        enqueue(&client, &NewJob::new("echo", json!({})))
            .await
            .unwrap();
    }
    let (mut run, log) = echo_on_one_process(&db).await;
    let printed = |log: &str| {
        log.lines()
            .filter(|l| l.contains("pgwake::persistent: echo "))
            .count()
    };
    eventually("every line is logged", Duration::from_secs(10), || {
        let log = log.clone();
        async move { printed(&log.lock().unwrap()) == 2 * JOBS }
    })
    .await;
    send_signal(run.child(), libc::SIGTERM);
    let _ = run.child().wait();
    let log = log.lock().unwrap().clone();
    let mistagged: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("pgwake::persistent: echo "))
        .filter(|l| {
            let printed_by = l
                .split("pgwake::persistent: echo ")
                .nth(1)
                .and_then(|r| r.split([' ', '\n']).next())
                .unwrap_or("?");
            !l.contains(&format!(" job={printed_by} "))
        })
        .collect();
    assert!(
        mistagged.is_empty(),
        "{} of {} lines tagged with another job than the one that printed them, e.g.:\n{}",
        mistagged.len(),
        2 * JOBS,
        mistagged
            .iter()
            .take(5)
            .copied()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
