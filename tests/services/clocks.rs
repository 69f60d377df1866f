//! Time-based values come from the database's clock, not the worker's or
//! the producer's: `--delay` and `NewJob::delay` are `now() + delay` on the
//! server; a worker whose clock runs an hour ahead (under libfaketime)
//! sleeps until a scheduled job is due by the database's clock instead of
//! polling in a tight loop. (The conversion of retry hints with the
//! measured offset is tested in `src/services/poller.rs`.)

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

async fn delay_of(db: &TestDb, id: i64) -> f64 {
    db.client()
        .await
        .query_one(
            "SELECT extract(epoch FROM run_at - created_at)::float8 FROM pgwake.jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn enqueue_delay_counts_from_the_database_clock() {
    let db = migrated_db().await;
    // run_at and created_at come from the same now(): exactly the delay,
    // whatever this machine's clock says.
    let out = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["enqueue", "--task", "t", "--delay", "90s"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let id: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert_eq!(delay_of(&db, id).await, 90.0);

    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).delay(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    assert_eq!(delay_of(&db, id).await, 1.5);
}

/// The sum of `pgwake_claims_total{trigger="poll",…}` on the worker's
/// /metrics at `addr`.
fn poll_claims(addr: &str) -> f64 {
    metric_sum(addr, "pgwake_claims_total", &["trigger=\"poll\""])
}

#[tokio::test]
async fn a_worker_whose_clock_runs_an_hour_ahead_does_not_spin_before_a_scheduled_job() {
    // libfaketime preloaded into pgwake itself (the `faketime` wrapper would
    // stand between the test's signal and the worker).
    let lib = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())
    .expect("libfaketime is not installed: run .ci/deps (apt-get install faketime)");
    let db = migrated_db().await;
    let id: i64 = db
        .scalar("INSERT INTO pgwake.jobs (task, run_at) VALUES ('t', now() + interval '3 seconds') RETURNING id")
        .await;
    let mut child = pgwake_cmd()
        .env("LD_PRELOAD", lib)
        .env("FAKETIME", "+1h")
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--poll-interval",
            "1s",
            "--handler",
            "t=exec:true",
        ])
        .env("DATABASE_URL", &db.url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = tail_stderr(&mut child);
    eventually("the scheduled job ran", Duration::from_secs(60), || async {
        let left: i64 = db
            .scalar(&format!("SELECT count(*) FROM pgwake.jobs WHERE id = {id}"))
            .await;
        left == 0
    })
    .await;
    // The worker did not poll in a loop meanwhile: with a 1 s poll interval
    // a sleeping poller claims about 3 times in those 3 s; the former one,
    // comparing run_at with its own clock an hour ahead, polled without
    // pause until the job was due.
    let addr = metrics_addr(&log).await;
    let polls = poll_claims(&addr);
    eprintln!("{polls} poll-triggered claims before a job 3 s ahead");
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
    assert!(
        polls < 30.0,
        "{polls} polls before a job 3 s ahead: the poller spun"
    );
}
