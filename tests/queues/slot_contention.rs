//! Two claims of one worker contending for a limited queue's last slot lose
//! no wake-up, in both delivery modes. A limited claim locks a free row of
//! `pgwake.queue_slots` (`FOR UPDATE SKIP LOCKED`) and keeps it locked
//! until its transaction ends, even when it finds no job; a claim sent
//! meanwhile skips the slot and finds nothing either, so a job committed
//! between the first claim's snapshot and its commit is seen by neither.
//! The claim that ends last claims once more (src/claim/choose/overlap.rs).

use crate::common;

use std::time::Duration;

use common::*;

/// The sum of `pgwake_claims_total{mode=MODE,result="empty"}` on the
/// worker's /metrics at `addr`.
fn empty_claims(addr: &str, mode: &str) -> f64 {
    metric_sum(
        addr,
        "pgwake_claims_total",
        &[&format!("mode=\"{mode}\""), "result=\"empty\""],
    )
}

/// Commits of the sessions that have `synchronous_commit` on (the
/// worker's) wait for a standby that never comes, until `on(false)`; the
/// test's own sessions commit locally.
async fn hold_commits(c: &tokio_postgres::Client, on: bool) {
    let set = if on {
        "ALTER SYSTEM SET synchronous_standby_names = 'pgwake_test_no_standby'"
    } else {
        "ALTER SYSTEM RESET synchronous_standby_names"
    };
    c.batch_execute(set).await.unwrap();
    c.batch_execute("SELECT pg_reload_conf()").await.unwrap();
}

/// The queue runs one job at a time. Claim 1 takes the slot, finds nothing
/// (the only job is another worker's task) and its commit is held (a
/// synchronous standby that never answers); job C is committed; claim 2,
/// woken by C's notification, skips the locked slot and finds nothing, and
/// so does its re-check. Then the commit of claim 1 goes through: C must
/// run without waiting for the fallback poll (10 minutes here). Without the
/// re-claim, C waited for the poll.
async fn a_claim_that_skipped_a_slot_locked_by_an_empty_claim_is_made_again(mode: &str) {
    let (_cluster, db) = private_cluster_db().await;
    limit_queue(&db, "default", 1);
    let c = db.client().await;
    c.batch_execute("SET synchronous_commit = local")
        .await
        .unwrap();
    // Keeps the queue listed as ready; this worker has no handler for it.
    c.batch_execute("INSERT INTO pgwake.jobs (task) VALUES ('not_ours')")
        .await
        .unwrap();
    let mut child = KillOnDrop::new(
        pgwake_cmd()
            .env("DATABASE_URL", &db.url)
            .args([
                "run",
                "--metrics-addr",
                "127.0.0.1:0",
                "--poll-interval",
                "10m",
                "--concurrency",
                "4",
                "--handler",
                "t=exec:true",
                &format!("--{mode}-queues"),
                "default",
                // Lease mode: a turn per slot, so claim 2 is sent beside
                // claim 1 rather than left to it (claim/lease/turn.rs).
                "--batch",
                "1",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let log = tail_stderr(child.child());
    let addr = metrics_addr(&log).await;
    // Idle and registered for notifications, its re-check claim made.
    eventually("the worker registered", Duration::from_secs(30), || async {
        let n: i64 = db
            .scalar("SELECT count(*) FROM pgwake.waiting_workers")
            .await;
        n == 1
    })
    .await;

    hold_commits(&c, true).await;
    c.batch_execute("SELECT pg_notify('pgwake', 'default')")
        .await
        .unwrap();
    // Claim 1: holds the slot (the row's locker) and waits for its commit.
    eventually(
        "a claim holding the slot, its commit held",
        Duration::from_secs(30),
        || async {
            c.query_one(
                "SELECT EXISTS (SELECT FROM pg_stat_activity a, pgwake.queue_slots s
                                WHERE s.queue = 'default' AND a.backend_xid = s.xmax
                                  AND a.wait_event = 'SyncRep')",
                &[],
            )
            .await
            .unwrap()
            .get(0)
        },
    )
    .await;
    let before = empty_claims(&addr, mode);
    let job: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Claim 2, empty while claim 1 holds the slot (and, if the round
    // re-checks the list of ready queues, its re-check).
    wait_for("claim 2", Duration::from_secs(30), async || {
        let n = empty_claims(&addr, mode);
        if n > before {
            Ok(())
        } else {
            Err(format!("{before} then {n}"))
        }
    })
    .await;
    hold_commits(&c, false).await;
    eventually("job C ran", Duration::from_secs(30), || async {
        let left: i64 = c
            .query_one("SELECT count(*) FROM pgwake.jobs WHERE id = $1", &[&job])
            .await
            .unwrap()
            .get(0);
        left == 0
    })
    .await;
    send_signal(child.child(), libc::SIGTERM);
    let out = wait_exit(child.take(), Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

#[tokio::test]
async fn tx_mode_a_claim_that_skipped_a_slot_locked_by_an_empty_claim_is_made_again() {
    a_claim_that_skipped_a_slot_locked_by_an_empty_claim_is_made_again("tx").await;
}

#[tokio::test]
async fn lease_mode_a_claim_that_skipped_a_slot_locked_by_an_empty_claim_is_made_again() {
    a_claim_that_skipped_a_slot_locked_by_an_empty_claim_is_made_again("lease").await;
}
