//! The `exec` protocol: where a command's stdout goes.

use crate::common;

use std::io::Read;
use std::process::{Child, Stdio};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

const WAIT: Duration = Duration::from_secs(30);

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
