//! The `exec` protocol: what a command's exit status means (done, fail for
//! good, retry later, snooze), where its stderr and stdout go, and which variables
//! of the worker's environment it sees.

use crate::common;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::handlers::parse_flag;
use pgwake::Worker;

const WAIT: Duration = Duration::from_secs(30);

fn worker_with(db: &TestDb, flag: &str) -> Worker {
    worker_with_all(db, &[flag.to_string()])
}

fn worker_with_all(db: &TestDb, flags: &[String]) -> Worker {
    let mut b = Worker::builder(db.config()).config(test_config());
    for flag in flags {
        let (task, h) = parse_flag(flag).unwrap();
        b = b.handler_arc(&task, h);
    }
    b.build().unwrap()
}

/// A waiting job's delay until it is due, its attempts and `last_error`.
async fn waiting(db: &TestDb, id: i64) -> (f64, i32, String) {
    let row = db
        .client()
        .await
        .query_one(
            "SELECT extract(epoch FROM run_at - now())::float8, attempts, last_error \
             FROM pgwake.jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2))
}

#[tokio::test]
async fn exit_65_fails_the_job_for_good_with_its_stderr_tail() {
    let db = migrated_db().await;
    let client = db.client().await;
    // 25 attempts: without the protocol a bad payload is retried for hours.
    let id = enqueue(&client, &NewJob::new("bad", serde_json::json!({})))
        .await
        .unwrap();
    let flag = "bad=exec:sh -c 'echo checking; echo \"payload has no image\" >&2; exit 65'";
    let mut w = Running::start(worker_with(&db, flag));
    let ev = w.next_events(1, WAIT, |_| true).await;
    w.shutdown().await;
    assert_eq!((ev[0].id, ev[0].outcome()), (id, "dead"), "{ev:?}");
    let err = dead_reason(&client, id).await;
    assert!(err.contains("exit status 65"), "{err}");
    assert!(err.contains("payload has no image"), "{err}");
    let attempts: i32 = db
        .scalar(&format!(
            "SELECT attempts FROM pgwake.dead_jobs WHERE id = {id}"
        ))
        .await;
    assert_eq!(attempts, 1, "dead on its first attempt");
}

#[tokio::test]
async fn exit_75_retries_after_the_delay_the_command_gives_on_stderr() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for task in ["hour", "secs", "bare"] {
        ids.push(
            enqueue(&client, &NewJob::new(task, serde_json::json!({})))
                .await
                .unwrap(),
        );
    }
    let [hour, secs, bare] = ids[..] else {
        unreachable!()
    };
    let later = |delay: &str| {
        format!(
            "sh -c 'echo \"rate limited\" >&2; echo \"pgwake-retry-after: {delay}\" >&2; exit 75'"
        )
    };
    let flags = [
        format!("hour=exec:{}", later("1h")),
        format!("secs=exec:{}", later("90")),
        "bare=exec:sh -c 'exit 75'".to_string(),
    ];
    let mut w = Running::start(worker_with_all(&db, &flags));
    let ev = w
        .next_events(2, WAIT, |e| e.id == hour || e.id == secs)
        .await;
    w.next_events(1, WAIT, |e| e.id == bare).await;
    w.shutdown().await;
    assert!(ev.iter().all(|e| e.outcome() == "retry"), "{ev:?}");
    let (delay, attempts, err) = waiting(&db, hour).await;
    assert!(
        (3500.0..=3600.0).contains(&delay),
        "due in {delay} s, not 1h"
    );
    assert_eq!(
        attempts, 1,
        "a retry later is an attempt, like Outcome::Retry"
    );
    assert!(err.contains("exit status 75"), "{err}");
    assert!(err.contains("rate limited"), "{err}");
    let (delay, _, _) = waiting(&db, secs).await;
    assert!((80.0..=90.0).contains(&delay), "due in {delay} s, not 90 s");
    // Without the line, the configured backoff (20-100 ms in tests).
    let (delay, attempts, _) = waiting(&db, bare).await;
    assert!(
        attempts >= 1 && delay < 5.0,
        "due in {delay} s: the backoff applies"
    );
}

/// Exit 75 with a `pgwake-snooze:` line snoozes: due after the delay, no
/// attempt used, last error untouched, the snooze counted; a snooze line
/// that is no delay is a failed attempt that says so.
#[tokio::test]
async fn exit_75_with_a_snooze_line_snoozes_without_using_an_attempt() {
    let db = migrated_db().await;
    let client = db.client().await;
    let nap = enqueue(&client, &NewJob::new("nap", serde_json::json!({})))
        .await
        .unwrap();
    let bad = enqueue(&client, &NewJob::new("bad", serde_json::json!({})))
        .await
        .unwrap();
    let flags = [
        "nap=exec:sh -c 'echo \"not yet\" >&2; echo \"pgwake-snooze: 1h\" >&2; exit 75'"
            .to_string(),
        "bad=exec:sh -c 'echo \"pgwake-snooze: soonish\" >&2; exit 75'".to_string(),
    ];
    let mut w = Running::start(worker_with_all(&db, &flags));
    let ev = w.next_events(1, WAIT, |e| e.id == nap).await;
    let ev_bad = w.next_events(1, WAIT, |e| e.id == bad).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "snoozed", "{ev:?}");
    let row = client
        .query_one(
            "SELECT extract(epoch FROM run_at - now())::float8, attempts, last_error, \
                    (SELECT snoozes FROM pgwake.job_snoozes WHERE job_id = j.id) \
             FROM pgwake.jobs j WHERE id = $1",
            &[&nap],
        )
        .await
        .unwrap();
    let delay: f64 = row.get(0);
    assert!(
        (3500.0..=3600.0).contains(&delay),
        "due in {delay} s, not 1h"
    );
    assert_eq!(row.get::<_, i32>(1), 0, "no attempt used");
    assert_eq!(row.get::<_, Option<String>>(2), None, "not a failure");
    assert_eq!(
        row.get::<_, Option<i32>>(3),
        Some(1),
        "the snooze is counted"
    );
    assert_eq!(ev_bad[0].outcome(), "retry", "{ev_bad:?}");
    let err = ev_bad[0].error().unwrap_or_default();
    assert!(err.contains("\"soonish\" is not a delay"), "{err}");
}

#[tokio::test]
async fn other_exit_statuses_are_failed_attempts_retried_with_backoff() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("flaky", serde_json::json!({})))
        .await
        .unwrap();
    // A retry-after line counts only with exit 75.
    let flag = "flaky=exec:sh -c 'echo \"pgwake-retry-after: 1h\" >&2; exit 1'";
    let mut w = Running::start(worker_with(&db, flag));
    let ev = w.next_events(1, WAIT, |_| true).await;
    w.shutdown().await;
    assert_eq!((ev[0].id, ev[0].outcome()), (id, "retry"), "{ev:?}");
    assert!(ev[0].error().unwrap().contains("exit status 1"), "{ev:?}");
    let delay: f64 = db
        .scalar(&format!(
            "SELECT coalesce(max(extract(epoch FROM run_at - now())), 0)::float8 \
             FROM pgwake.jobs WHERE id = {id}"
        ))
        .await;
    assert!(delay < 5.0, "due in {delay} s: the backoff applies");
}

/// `pgwake run` with `args` (and `env` added to its environment) until
/// every job of `db` has left `pgwake.jobs` and `pgwake.leased_jobs`, then
/// stopped with SIGTERM; its exit code, stdout and stderr.
async fn run_until_drained(
    db: &TestDb,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Option<i32>, Vec<u8>, String) {
    let mut child: Child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .envs(env.iter().copied())
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--poll-interval",
            "200ms",
        ])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = r.read_to_end(&mut all);
            all
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    eventually("every job finished", WAIT, || async {
        let left: i64 = db
            .scalar(
                "SELECT (SELECT count(*) FROM pgwake.jobs) \
                      + (SELECT count(*) FROM pgwake.leased_jobs)",
            )
            .await;
        left == 0
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let status = wait_exit(child, WAIT).await.status;
    let stdout = out.join().unwrap();
    let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
    (status.code(), stdout, stderr)
}

#[tokio::test]
async fn every_stderr_line_reaches_the_worker_log_tagged_and_escaped() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("noisy", serde_json::json!({})).queue("imports"),
    )
    .await
    .unwrap();
    let handler = "noisy=exec:sh -c 'printf \"first line\\n\" >&2; \
                   printf \"red \\033[31mtext\\033[0m bell\\007 cr\\rend \\377\\n\" >&2; \
                   printf \"no newline at the end\" >&2'";
    let (code, _, log) = run_until_drained(&db, &["--handler", handler], &[]).await;
    assert_eq!(code, Some(0), "{log}");
    for expected in [
        "first line",
        // As `pgwake stats` escapes names; bytes that are not UTF-8 as \xNN.
        r"red \u{1b}[31mtext\u{1b}[0m bell\u{7} cr\u{d}end \xff",
        "no newline at the end",
    ] {
        let line = log
            .lines()
            .find(|l| l.contains(expected))
            .unwrap_or_else(|| panic!("{expected:?} is not in the worker log:\n{log}"));
        for tag in [
            format!("job={id}"),
            "task=noisy".to_string(),
            "queue=imports".to_string(),
        ] {
            assert!(line.contains(&tag), "{tag} missing from {line:?}");
        }
    }
    for byte in ['\x1b', '\x07', '\r'] {
        assert!(
            !log.contains(byte),
            "raw {byte:?} in the worker log:\n{log:?}"
        );
    }
}

#[tokio::test]
async fn stderr_in_the_worker_log_is_bounded_per_line_and_per_run() {
    let db = migrated_db().await;
    let client = db.client().await;
    enqueue(&client, &NewJob::new("chatty", serde_json::json!({})))
        .await
        .unwrap();
    // One 100 KB line, then 1,000 short ones: 1,001 lines.
    let handler = "chatty=exec:sh -c '{ head -c 100000 /dev/zero | tr \"\\0\" x; echo; \
                   seq 1 1000 | sed \"s/^/short line /\"; } >&2'";
    let (code, _, log) = run_until_drained(&db, &["--handler", handler], &[]).await;
    assert_eq!(code, Some(0), "{log}");
    let long = log
        .lines()
        .find(|l| l.contains("xxxx"))
        .expect("the long line is logged");
    assert!(long.contains("[cut"), "{}", &long[..200]);
    assert!(
        long.len() < 2048,
        "a logged line is bounded: {} bytes",
        long.len()
    );
    // 256 lines per run: the long one and short lines 1 to 255.
    assert!(log.contains("short line 255 "), "{log}");
    assert!(!log.contains("short line 256 "), "{log}");
    let summary = log
        .lines()
        .find(|l| l.contains("745") && l.contains("not logged"))
        .unwrap_or_else(|| panic!("no summary of the lines left out:\n{log}"));
    assert!(summary.contains("task=chatty"), "{summary}");
}

#[tokio::test]
async fn a_commands_stdout_never_reaches_the_worker_stdout() {
    let db = migrated_db().await;
    let handler = "out=exec:sh -c 'printf \"job-output-bytes \\033[2J\"'";
    for max in ["65536", "0"] {
        let client = db.client().await;
        enqueue(&client, &NewJob::new("out", serde_json::json!({})))
            .await
            .unwrap();
        let (code, stdout, log) =
            run_until_drained(&db, &["--handler", handler, "--exec-stdout-max", max], &[]).await;
        assert_eq!(code, Some(0), "{log}");
        let stdout = String::from_utf8_lossy(&stdout);
        assert!(
            !stdout.contains("job-output-bytes"),
            "--exec-stdout-max {max}: the job's stdout reached the worker's: {stdout:?}"
        );
    }
}

#[tokio::test]
async fn exec_env_passes_named_variables_through_unchanged() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let handler = format!(
        "env=exec:sh -c 'env > {}/$PGWAKE_JOB_ID.env'",
        dir.path().display()
    );
    let worker_env = [
        ("AWS_REGION", "eu-west-3"),
        ("AWS_PROFILE", "jobs"),
        ("PGWAKE_EXEC_API_TOKEN", "t0k"),
    ];
    // The flag (twice), the environment form, and neither: a run's flags and
    // the variables added to the worker's environment.
    type Run = (
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
    );
    let runs: [Run; 3] = [
        (
            &["--exec-env", "AWS_REGION", "--exec-env", "AWS_PROFILE"],
            &[],
        ),
        (&[], &[("PGWAKE_PASS_ENV", "AWS_REGION,AWS_PROFILE")]),
        (&[], &[]),
    ];
    let mut seen = Vec::new();
    for (flags, extra_env) in runs {
        let id = enqueue(
            &db.client().await,
            &NewJob::new("env", serde_json::json!({})),
        )
        .await
        .unwrap();
        let mut args = vec!["--handler", handler.as_str()];
        args.extend_from_slice(flags);
        let env: Vec<(&str, &str)> = worker_env.iter().chain(extra_env).copied().collect();
        let (code, _, log) = run_until_drained(&db, &args, &env).await;
        assert_eq!(code, Some(0), "{log}");
        seen.push(std::fs::read_to_string(dir.path().join(format!("{id}.env"))).unwrap());
    }
    for env in &seen[..2] {
        let has = |line: &str| env.lines().any(|l| l == line);
        assert!(has("AWS_REGION=eu-west-3"), "{env}");
        assert!(has("AWS_PROFILE=jobs"), "{env}");
        assert!(has("API_TOKEN=t0k"), "renaming still works: {env}");
        assert!(!env.contains("DATABASE_URL"), "{env}");
    }
    assert!(
        !seen[2].contains("AWS_REGION"),
        "not passed unless named: {}",
        seen[2]
    );
    assert!(!seen[2].contains("AWS_PROFILE"), "{}", seen[2]);
}

#[test]
fn exec_env_refuses_the_database_secrets() {
    for (args, env, named) in [
        (&["--exec-env", "DATABASE_URL"][..], None, "DATABASE_URL"),
        (&["--exec-env", "PGPASSWORD"][..], None, "PGPASSWORD"),
        (
            &[
                "--exec-env",
                "AWS_REGION",
                "--exec-env",
                "PGWAKE_LISTEN_DATABASE_URL",
            ][..],
            None,
            "the worker's own settings",
        ),
        (&[][..], Some("AWS_REGION,PGPASSFILE"), "PGPASSFILE"),
        (&["--exec-env", "pgpassword"][..], None, "password"),
        (
            &["--exec-env", "PGWAKE_EXEC_API_TOKEN"][..],
            None,
            "as <NAME> (here API_TOKEN)",
        ),
        (&["--exec-env", "A=B"][..], None, "not a variable name"),
    ] {
        let mut c = pgwake_cmd();
        c.args(["run", "--handler", "t=exec:true"]).args(args);
        if let Some(v) = env {
            c.env("PGWAKE_PASS_ENV", v);
        }
        let o = c.output().unwrap();
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(err.contains(named), "{args:?} {env:?}: {err}");
        assert!(err.contains("--exec-env"), "{err}");
    }
}

#[tokio::test]
async fn a_run_stopped_at_its_timeout_still_logs_its_last_stderr_line() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("stuck", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    // A line without its newline, then the command hangs until killed.
    let handler = "stuck=exec:sh -c 'printf \"stuck at step 3\" >&2; exec sleep 3600'";
    let (code, _, log) =
        run_until_drained(&db, &["--handler", handler, "--job-timeout", "500ms"], &[]).await;
    assert_eq!(code, Some(0), "{log}");
    assert!(dead_reason(&client, id).await.contains("timed out"));
    let line = log
        .lines()
        .find(|l| l.contains("stuck at step 3"))
        .unwrap_or_else(|| panic!("the last line is not in the worker log:\n{log}"));
    assert!(line.contains(&format!("job={id}")), "{line}");
}
