//! What the persistent handler tests share: the reference workers, a
//! worker built from `--handler` flags, and the handler processes a test
//! can find and kill.

use std::path::PathBuf;
use std::time::Duration;

use pgwake::handlers::persistent::Options;
use pgwake::handlers::Parser;
use pgwake::{Delivery, Worker, WorkerConfig};

use crate::common::*;

pub const WAIT: Duration = Duration::from_secs(60);

/// `examples/persistent/FILE` of the repository.
pub fn example(file: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/persistent")
        .join(file)
        .display()
        .to_string()
}

/// The Python reference worker as a command.
pub fn python_worker(args: &str) -> String {
    format!("python3 {} {args}", example("worker.py"))
}

/// The Node reference worker as a command.
pub fn node_worker(args: &str) -> String {
    format!("node {} {args}", example("worker.mjs"))
}

/// The misbehaving test worker (`tests/persistent/quirky.py`) as a command.
pub fn quirky(args: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/persistent/quirky.py");
    format!("python3 {} {args}", path.display())
}

/// Options for tests: `processes` processes, short liveness bounds.
pub fn options(processes: usize) -> Options {
    Options {
        processes,
        ping_interval: Duration::from_millis(200),
        process_timeout: Duration::from_secs(3),
        start_timeout: Duration::from_secs(30),
        cancel_grace: Duration::from_secs(2),
        ..Options::default()
    }
}

/// A worker whose `tasks` all go to `command` (tx mode for `tx_tasks`).
pub fn worker(
    db: &TestDb,
    command: &str,
    tasks: &[&str],
    tx_tasks: &[&str],
    opts: Options,
    config: WorkerConfig,
) -> Worker {
    let mut parser = Parser::new(0, &[], opts);
    let mut b = Worker::builder(db.config()).config(config);
    for task in tasks {
        let (task, h) = parser
            .parse(&format!("{task}=persistent:{command}"))
            .unwrap();
        let h = if tx_tasks.contains(&task.as_str()) {
            pgwake::handlers::with_delivery(h, Delivery::Tx)
        } else {
            h
        };
        b = b.handler_arc(&task, h);
    }
    b.build().unwrap()
}

/// `command` run with `PGWAKE_TEST_TAG=tag` in its environment, so that
/// [`tagged`] finds this test's processes and no other's (the tests of this
/// binary run side by side in one process).
pub fn tag(tag: &str, command: &str) -> String {
    format!("env PGWAKE_TEST_TAG={tag} {command}")
}

/// The live processes this test process started that run with
/// `PGWAKE_TEST_TAG=tag` (see [`tag`]).
pub fn tagged(tag: &str) -> Vec<i32> {
    let needle = format!("PGWAKE_TEST_TAG={tag}\0");
    let mut out: Vec<i32> = children("")
        .into_iter()
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let env = String::from_utf8_lossy(&env).into_owned() + "\0";
            env.contains(&needle)
        })
        .collect();
    out.sort();
    out
}

/// The live processes this test process started whose command line
/// contains `needle`.
pub fn children(needle: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.to_owned()) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let ppid: i32 = fields.get(1).and_then(|p| p.parse().ok()).unwrap_or(0);
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if ppid == me && String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Wait until job `id` has started running (its lease taken, or its
/// claim held), as the database says.
pub async fn until_running(db: &TestDb, id: i64) {
    eventually("the job runs", WAIT, || async {
        let n: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.leased_jobs WHERE id = {id} AND NOT buffered"
            ))
            .await;
        n == 1
    })
    .await;
}

/// A finished job's outcome, attempts, result and error from the history
/// (waiting for its row).
pub async fn finished(
    db: &TestDb,
    id: i64,
) -> (String, i32, Option<serde_json::Value>, Option<String>) {
    let client = db.client().await;
    // The event may come before the outcome's write commits.
    eventually("the job is in the history", WAIT, || async {
        let n: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.finished_jobs WHERE id = {id}"
            ))
            .await;
        n == 1
    })
    .await;
    let row = client
        .query_one(
            "SELECT outcome, attempts, result, error FROM pgwake.finished_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1), row.get(2), row.get(3))
}

/// A config with history on and quick retries.
pub fn history_config() -> WorkerConfig {
    let mut c = test_config();
    c.history.keep_finished = pgwake::config::KeepFinished::parse("1h").unwrap();
    c
}
