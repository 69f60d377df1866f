//! An `exec` job's whole process tree ends with it: what a wrapper script
//! starts in the background, in a new session (`setsid`) or as a
//! double-forked daemon dies when the worker is killed (-9), at the job's
//! timeout and on cancel, so a rescued or retried run never runs beside a
//! leftover of the first. Through the `pgwake` binary (the exec shim, a
//! child subreaper) every shape is contained; an embedding program's
//! in-process worker (the forking fallback) contains what it can still
//! find at the timeout and on cancel: the command's process group and its
//! descendants.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::handlers::exec::ExecHandler;
use pgwake::{Worker, WorkerConfig};

const LONG: Duration = Duration::from_secs(60);

/// How each wrapper starts its grandchild.
const SHAPES: [&str; 3] = ["background", "setsid", "daemon"];

/// The wrapper script: `wrapper SHAPE DIR` records its own pid in
/// `DIR/<job id>.wrapper`, starts `sleep 300` as SHAPE says and records
/// the sleep's pid in `DIR/<job id>.grandchild`, then waits:
/// - `background`: `sleep 300 &` (same process group), then `wait`;
/// - `setsid`: `setsid sleep 300 &` (a session and group of its own, its
///   parent still the wrapper), then `wait`;
/// - `daemon`: a double fork through `setsid sh -c '… &'` whose middle
///   process exits at once (the sleep is orphaned, its standard streams on
///   /dev/null), then a foreground `sleep 600`.
fn wrapper(dir: &Path) -> PathBuf {
    let script = dir.join("wrapper");
    std::fs::write(
        &script,
        r#"#!/bin/sh
d="$2/$PGWAKE_JOB_ID"
echo $$ > "$d.wrapper"
case "$1" in
background)
    sleep 300 &
    echo $! > "$d.tmp" ;;
setsid)
    setsid sleep 300 &
    echo $! > "$d.tmp" ;;
daemon)
    setsid sh -c 'sleep 300 </dev/null >/dev/null 2>&1 & echo $! > "$0"' "$d.tmp" </dev/null >/dev/null 2>&1 &
    wait $! ;;
esac
mv "$d.tmp" "$d.grandchild"
if [ "$1" = daemon ]; then sleep 600; else wait; fi
"#,
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    script
}

/// `SHAPE=exec:WRAPPER SHAPE DIR`, one handler flag per shape.
fn flags(dir: &Path, shapes: &[&str]) -> Vec<String> {
    let script = wrapper(dir);
    shapes
        .iter()
        .map(|shape| {
            format!(
                "{shape}=exec:{} {shape} {}",
                script.display(),
                dir.display()
            )
        })
        .collect()
}

/// Whether process `pid` is gone (or a zombie: dead, not yet reaped).
fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// The processes a job's wrapper recorded. Whatever is still a `sleep`
/// when the test ends (a failed run) is killed, so a failure leaves
/// nothing behind.
struct Tree {
    shape: &'static str,
    wrapper: i32,
    grandchild: i32,
}

struct Trees(Vec<Tree>);

impl Drop for Trees {
    fn drop(&mut self) {
        for t in &self.0 {
            for pid in [t.wrapper, t.grandchild] {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                if cmdline.windows(5).any(|w| w == b"sleep")
                    || cmdline.windows(7).any(|w| w == b"wrapper")
                {
                    // SAFETY: kill(2) of a process this test started (checked
                    // by its command line just before).
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
        }
    }
}

/// Enqueue one job per shape (one attempt each) and wait until each has
/// started its grandchild; returns the job ids and their trees.
async fn start_jobs(db: &TestDb, dir: &Path, shapes: &[&'static str]) -> (Vec<i64>, Trees) {
    let client = db.client().await;
    let mut ids = Vec::new();
    for shape in shapes {
        ids.push(
            enqueue(
                &client,
                &NewJob::new(*shape, serde_json::json!({})).max_attempts(1),
            )
            .await
            .unwrap(),
        );
    }
    let mut trees = Trees(Vec::new());
    for (id, shape) in ids.iter().zip(shapes) {
        let read = |what: &str| {
            std::fs::read_to_string(dir.join(format!("{id}.{what}")))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
        };
        let (wrapper, grandchild) = wait_for(
            &format!("the {shape} job's grandchild to start"),
            LONG,
            async || match (read("wrapper"), read("grandchild")) {
                (Some(w), Some(g)) => Ok((w, g)),
                other => Err(format!("{other:?}")),
            },
        )
        .await;
        trees.0.push(Tree {
            shape,
            wrapper,
            grandchild,
        });
    }
    (ids, trees)
}

/// Every recorded process ends (bounded wait, polled).
async fn assert_all_gone(trees: &Trees, when: &str) {
    wait_for(
        &format!("every process of the jobs to be gone {when}"),
        Duration::from_secs(20),
        async || {
            let alive: Vec<String> = trees
                .0
                .iter()
                .flat_map(|t| {
                    [("wrapper", t.wrapper), ("grandchild", t.grandchild)]
                        .into_iter()
                        .filter(|(_, pid)| !process_gone(*pid))
                        .map(move |(what, pid)| format!("{}'s {what} {pid}", t.shape))
                })
                .collect();
            if alive.is_empty() {
                Ok(())
            } else {
                Err(format!("still alive: {}", alive.join(", ")))
            }
        },
    )
    .await;
}

/// `pgwake run` with one handler per shape.
fn binary_worker(db: &TestDb, dir: &Path, extra: &[&str]) -> Child {
    let flags = flags(dir, &SHAPES);
    let mut args: Vec<&str> = Vec::new();
    for f in &flags {
        args.extend(["--handler", f.as_str()]);
    }
    args.extend(extra);
    spawn_pgwake_run(&db.url, &args)
}

/// A `kill -9` of the worker takes every job's whole tree with it: the
/// background child, the one in a session of its own and the orphaned
/// daemon. (`PR_SET_PDEATHSIG` on the command alone killed only the
/// wrapper: every grandchild lived on beside the rescued retry.)
#[tokio::test]
async fn a_killed_worker_takes_every_process_of_its_jobs_with_it() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let mut worker = binary_worker(&db, dir.path(), &["--job-timeout", "10m"]);
    let (_, trees) = start_jobs(&db, dir.path(), &SHAPES).await;
    send_signal(&worker, libc::SIGKILL);
    let _ = worker.wait();
    assert_all_gone(&trees, "after the worker was killed").await;
}

/// At the job's timeout, through the binary: every shape is killed, and
/// only then is the job dead.
#[tokio::test]
async fn at_the_timeout_every_process_of_the_job_is_killed() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let mut worker = binary_worker(&db, dir.path(), &["--job-timeout", "3s"]);
    let (ids, trees) = start_jobs(&db, dir.path(), &SHAPES).await;
    let client = db.client().await;
    wait_for("the jobs to time out", LONG, async || {
        let dead: i64 = db
            .scalar("SELECT count(*) FROM pgwake.dead_jobs WHERE last_error LIKE '%timed out%'")
            .await;
        if dead == ids.len() as i64 {
            Ok(())
        } else {
            Err(format!("{dead} timed out"))
        }
    })
    .await;
    assert_all_gone(&trees, "after the timeout").await;
    drop(client);
    send_signal(&worker, libc::SIGTERM);
    let _ = worker.wait();
}

/// `pgwake cancel` of running jobs, through the binary: every shape is
/// killed.
#[tokio::test]
async fn on_cancel_every_process_of_the_job_is_killed() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let mut worker = binary_worker(
        &db,
        dir.path(),
        &["--job-timeout", "10m", "--cancel-poll-interval", "200ms"],
    );
    let (ids, trees) = start_jobs(&db, dir.path(), &SHAPES).await;
    let mut args = vec!["cancel".to_string()];
    args.extend(ids.iter().map(i64::to_string));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run_pgwake(&args, Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    wait_for("the jobs to be cancelled", LONG, async || {
        let dead: i64 = db
            .scalar("SELECT count(*) FROM pgwake.dead_jobs WHERE last_error = 'cancelled'")
            .await;
        if dead == ids.len() as i64 {
            Ok(())
        } else {
            Err(format!("{dead} cancelled"))
        }
    })
    .await;
    assert_all_gone(&trees, "after the cancel").await;
    send_signal(&worker, libc::SIGTERM);
    let _ = worker.wait();
}

/// A command that exits leaving a process behind (here one in a session of
/// its own, which ignores its closed pipes) does not leave it running
/// beside the job's next attempt: through the binary, the rest of the tree
/// is killed when the command ends.
#[tokio::test]
async fn what_a_command_leaves_behind_ends_with_it() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!(
        "leave=exec:sh -c 'setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {d}/$PGWAKE_JOB_ID.grandchild; echo $$ > {d}/$PGWAKE_JOB_ID.wrapper; exit 1'"
    );
    let mut worker = spawn_pgwake_run(&db.url, &["--handler", &handler]);
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("leave", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    eventually("the job to end dead", LONG, || async {
        db.scalar::<i64>(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {id}"
        ))
        .await
            == 1
    })
    .await;
    let read = |what: &str| -> i32 {
        std::fs::read_to_string(dir.path().join(format!("{id}.{what}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let trees = Trees(vec![Tree {
        shape: "leave",
        wrapper: read("wrapper"),
        grandchild: read("grandchild"),
    }]);
    assert_all_gone(&trees, "after the command exited").await;
    send_signal(&worker, libc::SIGTERM);
    let _ = worker.wait();
}

/// An in-process worker (no exec shim: the worker forks the command) at
/// the timeout and on cancel: the background child and the one in a
/// session of its own, still a child of the wrapper, are found and killed
/// (a double-forked daemon is not: see `handlers/exec.rs`).
#[tokio::test]
async fn without_the_shim_the_timeout_and_cancel_kill_the_descendants_still_linked() {
    let shapes = ["background", "setsid"];
    for cancel in [false, true] {
        let db = migrated_db().await;
        let dir = tempfile::tempdir().unwrap();
        let mut builder = Worker::builder(db.config()).config(WorkerConfig {
            job_timeout: if cancel {
                Duration::from_secs(600)
            } else {
                Duration::from_secs(3)
            },
            cancel_poll_interval: Duration::from_millis(200),
            ..test_config()
        });
        for flag in flags(dir.path(), &shapes) {
            let (task, spec) = flag.split_once("=exec:").unwrap();
            builder = builder.handler(task, ExecHandler::parse(spec).unwrap());
        }
        let mut w = Running::start(builder.build().unwrap());
        let (ids, trees) = start_jobs(&db, dir.path(), &shapes).await;
        if cancel {
            let client = db.client().await;
            for id in &ids {
                pgwake::cancel(&client, *id).await.unwrap();
            }
        }
        let evs = w.next_events(ids.len(), LONG, |_| true).await;
        let ended = if cancel { "cancelled" } else { "dead" };
        assert!(
            evs.iter().all(|e| e.outcome() == ended),
            "cancel {cancel}: {evs:?}"
        );
        assert_all_gone(
            &trees,
            if cancel {
                "after the cancel"
            } else {
                "after the timeout"
            },
        )
        .await;
        w.shutdown().await;
    }
}
