//! Per-key running limits (issue 24): `--max-running-per-key N` and a key's
//! own `--key K --max-running N` hold across every worker process, in both
//! delivery modes, with workers killed with `-9` mid-run, and while a
//! limit is lowered with jobs running. Checked on the ledger of start and
//! end times (database clock) written by the chaos worker.
//!
//! Teeth: with `LIMITED` false (no per-key setting) the first test fails
//! (tx: 11 runs of key `a` at once); with the `CONTINUE WHEN EXISTS (…
//! slot > lim)` guard removed from `pgwake.fair_key_jobs`, the lowering
//! test fails (lease: runs started while 4 and 5 others of the key ran).

use crate::common;
use crate::queues::{peak_running, started_over_limit, until_all_ran};

use std::collections::HashSet;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(180);

/// Whether the test sets the per-key limits (false shows it fails
/// without them).
const LIMITED: bool = true;

async fn insert_keyed(db: &TestDb, queue: &str, task: &str, key: &str, n: i32) -> Vec<i64> {
    db.client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             SELECT $1, $2, jsonb_build_object('n', g), $3 FROM generate_series(1, $4) g
             RETURNING id",
            &[&queue, &task, &key, &n],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

fn queue_set(db: &TestDb, args: &[&str]) {
    let mut all = vec!["queue", "set"];
    all.extend_from_slice(args);
    let out = run_pgwake(&all, Some(&db.url));
    assert!(out.status.success(), "{all:?}: {}", stderr_of(&out));
}

/// Three keys of one queue, 2 at once per key and 3 for key `big`; three
/// worker processes of 8 places each, two of them killed mid-run (tx mode
/// rolls their runs back, lease mode's leases are rescued). From the
/// ledger: no key ever ran more than its limit at once; every job ran;
/// every key slot is free at the end.
async fn per_key_limits_hold_across_workers_and_kills(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    if LIMITED {
        queue_set(&db, &["tn", "--max-running-per-key", "2"]);
        queue_set(&db, &["tn", "--key", "big", "--max-running", "3"]);
    }
    let a = insert_keyed(&db, "tn", "work", "a", 60).await;
    let b = insert_keyed(&db, "tn", "work", "b", 60).await;
    let big = insert_keyed(&db, "tn", "work", "big", 60).await;
    let mut args = vec![
        "--sleep-ms",
        "20",
        "--concurrency",
        "8",
        "--record-end",
        "--lease-ms",
        "1000",
        "--rescue-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    let mut workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let all: Vec<i64> = a.iter().chain(&b).chain(&big).copied().collect();
    let mut killed = Vec::new();
    for (i, after) in [30usize, 80].into_iter().enumerate() {
        let want: HashSet<i64> = all.iter().copied().collect();
        until_runs(&db, "runs of the keys", LONG, |runs| {
            runs.iter().filter(|r| want.contains(&r.0)).count() >= after
        })
        .await;
        let pid = workers[i].pid();
        let at: String = db.scalar("SELECT clock_timestamp()::text").await;
        workers[i].kill9();
        killed.push((pid, at));
        workers.push(ChaosWorker::spawn(&db, &args));
    }
    until_all_ran(&db, "every job to run", &all).await;
    until_drained(&db).await;
    for w in workers.drain(..) {
        if w.child.id() as i32 != killed[0].0 && w.child.id() as i32 != killed[1].0 {
            w.terminate().await;
        }
    }
    for (name, ids, limit) in [("a", &a, 2), ("b", &b, 2), ("big", &big, 3)] {
        let peak = peak_running(&db, ids, &killed).await;
        assert!(
            peak <= limit,
            "{peak} jobs of key {name} ran at once, its limit is {limit}"
        );
        assert!(peak >= 1);
    }
    let held: i64 = db
        .scalar("SELECT count(*) FROM pgwake.key_slots WHERE lease_token IS NOT NULL")
        .await;
    assert_eq!(held, 0, "a key slot is still held after every job ended");
    // `pgwake queue list` shows the settings.
    let list = pgwake::admin::queues::list(&db.client().await)
        .await
        .unwrap();
    let tn = list.iter().find(|q| q.queue == "tn").unwrap();
    assert_eq!(tn.max_running_per_key, Some(2));
    assert_eq!(tn.key_max_running.get("big"), Some(&3));
}

#[tokio::test(flavor = "multi_thread")]
async fn per_key_limits_hold_across_workers_and_kills_tx() {
    per_key_limits_hold_across_workers_and_kills(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn per_key_limits_hold_across_workers_and_kills_lease() {
    per_key_limits_hold_across_workers_and_kills(&["--lease-handler"]).await;
}

/// `--max-running-per-key 6`, six jobs of key `a` running (gated) on three
/// worker processes, more of the key waiting; the limit is lowered to 2.
/// No job started after the change runs with 2 or more others of the key
/// alive, and every waiting job still runs (as
/// `queues::lowered_max_running_holds_for_jobs_started_after_the_change`,
/// whose comments say why the gate makes the check exact).
async fn lowered_per_key_limit_holds_for_jobs_started_after_the_change(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    let gate = Gate::closed(&db).await;
    queue_set(&db, &["tn", "--max-running-per-key", "6"]);
    let gated: Vec<i64> = db
        .client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             SELECT 'tn', 'gated', jsonb_build_object('ms', 200 * g), 'a'
             FROM generate_series(1, 6) g RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut args = vec![
        "--sleep-ms",
        "300",
        "--poll-ms",
        "100",
        "--concurrency",
        "4",
        "--record-end",
    ];
    args.extend_from_slice(extra);
    let workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    until_all_ran(&db, "the six gated jobs to run", &gated).await;
    let waiting = insert_keyed(&db, "tn", "work", "a", 30).await;
    queue_set(&db, &["tn", "--max-running-per-key", "2"]);
    let change: String = db.scalar("SELECT clock_timestamp()::text").await;
    wait_for(
        "claims begun before the change to finish",
        LONG,
        async || {
            let n: i64 = db
                .client()
                .await
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND state = 'active'
                       AND pid <> pg_backend_pid() AND application_name <> 'chaos-ledger'
                       AND query_start < $1::text::timestamptz",
                    &[&change],
                )
                .await
                .unwrap()
                .get(0);
            if n == 0 {
                Ok(())
            } else {
                Err(format!("{n} statements"))
            }
        },
    )
    .await;
    gate.open().await;
    let all: Vec<i64> = gated.iter().chain(&waiting).copied().collect();
    until_all_ran(&db, "every job to run", &all).await;
    until_drained(&db).await;
    for w in workers {
        w.terminate().await;
    }
    let over = started_over_limit(&db, &all, &change, 2).await;
    assert!(
        over.is_empty(),
        "runs of key a started after its limit was lowered to 2 while 2 or more others ran \
         (job, start, alive): {over:?}"
    );
    let after: i64 = db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND at > $2::text::timestamptz",
            &[&waiting, &change],
        )
        .await
        .unwrap()
        .get(0);
    assert!(after >= 30, "the waiting jobs ran after the change");
    let slots: i64 = db
        .scalar(
            "SELECT count(*) FROM pgwake.key_slots WHERE limit_key = 'a' AND lease_token IS NULL",
        )
        .await;
    assert_eq!(slots, 2, "the rows above the new limit are gone once free");
}

#[tokio::test(flavor = "multi_thread")]
async fn lowered_per_key_limit_holds_for_jobs_started_after_the_change_tx() {
    lowered_per_key_limit_holds_for_jobs_started_after_the_change(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lowered_per_key_limit_holds_for_jobs_started_after_the_change_lease() {
    lowered_per_key_limit_holds_for_jobs_started_after_the_change(&["--lease-handler"]).await;
}
