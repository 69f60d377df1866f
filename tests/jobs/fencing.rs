//! Lease fencing by claim token, with real worker processes: a worker that
//! stalls (SIGSTOP) while its job is rescued, buried, retried by hand and
//! claimed again as attempt 1 by another worker, wakes up and can neither
//! renew nor complete the new run.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

/// One run: `(job, attempt, pid)`.
type Run = (i64, i32, i32);

/// The runs that started, and those that ended.
fn runs(dir: &Path) -> (Vec<Run>, Vec<Run>) {
    let text = std::fs::read_to_string(dir.join("runs")).unwrap_or_default();
    let (mut starts, mut ends) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let run = (
            f[1].parse().unwrap(),
            f[2].parse().unwrap(),
            f[3].parse().unwrap(),
        );
        if f[0] == "start" {
            starts.push(run);
        } else {
            ends.push(run);
        }
    }
    (starts, ends)
}

async fn until_runs<F: Fn(&[Run]) -> bool>(dir: &Path, what: &str, f: F) {
    eventually(what, Duration::from_secs(60), || {
        let ok = f(&runs(dir).0);
        async move { ok }
    })
    .await;
}

/// A worker process that is killed (SIGKILL, which also ends a stopped
/// one) if the test fails before it stops it: no process outlives the test.
struct Worker(Option<std::process::Child>);

impl Worker {
    fn child(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("running")
    }

    fn take(mut self) -> std::process::Child {
        self.0.take().expect("running")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[tokio::test]
async fn a_stalled_worker_cannot_renew_or_complete_a_later_run_of_its_job() {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    // Each run waits until the test releases it by its shell's pid.
    let handler = format!(
        "slow=exec:sh -c 'echo start $PGWAKE_JOB_ID $PGWAKE_ATTEMPT $$ >> {d}/runs; \
         while [ ! -e {d}/release-$$ ]; do sleep 0.05; done; \
         echo end $PGWAKE_JOB_ID $PGWAKE_ATTEMPT $$ >> {d}/runs'"
    );
    let args = [
        "--concurrency",
        "1",
        "--lease-duration",
        "1s",
        "--rescue-interval",
        "200ms",
        "--handler",
        &handler,
    ];
    let id = enqueue(
        &client,
        &NewJob::new("slow", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let mut a = Worker(Some(spawn_pgwake_run(&db.url, &args)));
    let a_log = tail_stderr(a.child());
    until_runs(dir.path(), "A's run starts", |r| r.len() == 1).await;
    let first = runs(dir.path()).0[0];
    assert_eq!((first.0, first.1), (id, 1));
    // A stalls: no heartbeat, no completion.
    send_signal(a.child(), libc::SIGSTOP);
    let mut b = Worker(Some(spawn_pgwake_run(&db.url, &args)));
    let _b_log = tail_stderr(b.child());
    // B's rescuer finds the lease expired on the last attempt: dead.
    eventually("the job is buried", Duration::from_secs(60), || async {
        db.scalar::<i64>(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {id}"
        ))
        .await
            == 1
    })
    .await;
    // Retried by hand: attempts start again at 0, so B runs it as attempt 1,
    // the very (id, attempt) pair A's run had.
    let out = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["dead", "retry", "--id", &id.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    until_runs(dir.path(), "B's run starts", |r| r.len() == 2).await;
    let second = runs(dir.path()).0[1];
    assert_eq!((second.0, second.1), (id, 1));
    // A wakes up and its run ends; whatever it tries is fenced out.
    send_signal(a.child(), libc::SIGCONT);
    std::fs::write(dir.path().join(format!("release-{}", first.2)), b"").unwrap();
    let noticed = |log: &str| {
        log.contains("fenced") || log.contains("leases lost") || log.contains("stopped their runs")
    };
    wait_for(
        "A to notice it lost the job",
        Duration::from_secs(60),
        async || {
            let log = a_log.lock().unwrap().clone();
            if noticed(&log) {
                Ok(())
            } else {
                Err(format!("its log:\n{log}"))
            }
        },
    )
    .await;
    let leased: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.leased_jobs WHERE id = {id}"
        ))
        .await;
    assert_eq!(leased, 1, "B's lease is untouched");
    assert!(alive(second.2), "B's run was not stopped");
    assert!(
        !runs(dir.path()).1.iter().any(|r| r.2 == second.2),
        "B's run has not ended"
    );
    // B's run ends and completes the job.
    std::fs::write(dir.path().join(format!("release-{}", second.2)), b"").unwrap();
    eventually("the job completes", Duration::from_secs(60), || async {
        db.scalar::<i64>(
            "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs) + (SELECT count(*) FROM pgwake.dead_jobs)",
        )
        .await
            == 0
    })
    .await;
    assert!(runs(dir.path()).1.iter().any(|r| r.2 == second.2));
    for w in [a.take(), b.take()] {
        send_signal(&w, libc::SIGTERM);
        let out = wait_exit(w, Duration::from_secs(30)).await;
        assert!(out.status.success());
    }
}
