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
use crate::queues::{
    insert_keyed, ledger_spans, peak_running, queue_set, started_over_limit, until_all_ran,
};

use std::collections::HashSet;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(180);

/// Whether the test sets the per-key limits (false shows it fails
/// without them).
const LIMITED: bool = true;

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
    let a = insert_keyed(&db, "tn", "work", Some("a"), 60).await;
    let b = insert_keyed(&db, "tn", "work", Some("b"), 60).await;
    let big = insert_keyed(&db, "tn", "work", Some("big"), 60).await;
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
    a_per_key_limit_holds_for_jobs_started_after_the_change(Some("6"), false, extra).await;
}

/// Six jobs of key `a` running (gated) on three worker processes while the
/// queue has no per-key limit, so they hold no key slot (tx mode: in claim
/// transactions, named by their batch's mark; lease mode: leases with
/// `holds_key_slot` false); then `--max-running-per-key 2` and more jobs of
/// the key: no job starts after the change with 2 or more others of the key
/// alive (a limit is set when a key overloads something: the jobs already
/// running are what it must count).
///
/// Teeth: with the `unslotted` array of `pgwake.fair_key_jobs` left empty
/// (functions/claims.sql), both modes fail: runs of `a` start with the six
/// old ones alive.
async fn a_new_per_key_limit_counts_the_jobs_already_running(extra: &[&str]) {
    a_per_key_limit_holds_for_jobs_started_after_the_change(None, false, extra).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_per_key_limit_counts_the_jobs_already_running_tx() {
    a_new_per_key_limit_counts_the_jobs_already_running(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_per_key_limit_counts_the_jobs_already_running_lease() {
    // A lease long enough for the gated runs on a loaded machine: a lease
    // that expires while its run goes on lets the job run again beside it
    // (at-least-once), which this ledger would count as over the limit.
    a_new_per_key_limit_counts_the_jobs_already_running(&[
        "--lease-handler",
        "--lease-ms",
        "10000",
    ])
    .await;
}

/// As above, the six running jobs being suspects, each run alone after
/// their tx batch crashed (`run_suspect`): they hold no key slot either.
///
/// Teeth: with `run_suspect` making no mark, runs of `a` start beside the
/// six suspects.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_per_key_limit_counts_the_suspects_already_running() {
    a_per_key_limit_holds_for_jobs_started_after_the_change(None, true, &["--batch", "1"]).await;
}

/// Six gated jobs of key `a` run under per-key limit `initial` (None: no
/// limit), the limit becomes 2, 30 more jobs of `a` are enqueued: none
/// starts while 2 or more others of the key run. `crashed`: the six are
/// left in the mark of a crashed tx batch first, so they run as suspects.
async fn a_per_key_limit_holds_for_jobs_started_after_the_change(
    initial: Option<&str>,
    crashed: bool,
    extra: &[&str],
) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    let gate = Gate::closed(&db).await;
    if let Some(limit) = initial {
        queue_set(&db, &["tn", "--max-running-per-key", limit]);
    }
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
    if crashed {
        mark_as_crashed_batch(&db, &gated).await;
    }
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
    // Without a limit before the change, free places would start them at
    // once: they are enqueued after it then.
    let mut waiting = Vec::new();
    if initial.is_some() {
        waiting = insert_keyed(&db, "tn", "work", Some("a"), 30).await;
    }
    queue_set(&db, &["tn", "--max-running-per-key", "2"]);
    let change: String = db.scalar("SELECT clock_timestamp()::text").await;
    if initial.is_none() {
        waiting = insert_keyed(&db, "tn", "work", Some("a"), 30).await;
    }
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
         (job, start, alive): {over:?}; change at {change}; ledger (job, attempt, pid, start, end): {:?}",
        ledger_spans(&db).await
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
    // (The rescuer's sweep may have deleted the key's rows since: it has
    // no job left.)
    let slots: i64 = db
        .scalar("SELECT count(*) FROM pgwake.key_slots WHERE limit_key = 'a' AND slot > 2")
        .await;
    assert_eq!(slots, 0, "the rows above the new limit are gone once free");
}

#[tokio::test(flavor = "multi_thread")]
async fn lowered_per_key_limit_holds_for_jobs_started_after_the_change_tx() {
    lowered_per_key_limit_holds_for_jobs_started_after_the_change(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lowered_per_key_limit_holds_for_jobs_started_after_the_change_lease() {
    lowered_per_key_limit_holds_for_jobs_started_after_the_change(&["--lease-handler"]).await;
}

async fn slot_keys(db: &TestDb) -> Vec<String> {
    db.client()
        .await
        .query(
            "SELECT DISTINCT limit_key FROM pgwake.key_slots ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// 300 one-off keys of a queue with `--max-running-per-key 2` run once on
/// two worker processes (one killed with `-9` mid-run): the rescuer's
/// sweep deletes their slot rows, and keeps those of a key with a
/// scheduled job and of a key whose job runs (gated). Those keys' jobs then
/// run under their limit, and once they are gone, so are their rows.
///
/// Teeth: without the sweep in `Rescuer::run_once`
/// (src/services/rescuer.rs) the rows of the 300 keys stay and the wait
/// for them to go fails.
async fn the_slot_rows_of_keys_without_jobs_are_swept(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let gate = Gate::closed(&db).await;
    queue_set(&db, &["tn", "--max-running-per-key", "2"]);
    let c = db.client().await;
    let once: Vec<i64> = c
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             SELECT 'tn', 'work', '{}', 'once-' || g FROM generate_series(1, 300) g
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let later: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key, run_at)
             VALUES ('tn', 'work', '{}', 'scheduled', now() + interval '1 day') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let gated = insert_keyed(&db, "tn", "gated", Some("running"), 1).await;
    let mut args = vec![
        "--sleep-ms",
        "5",
        "--rescue-ms",
        "200",
        "--lease-ms",
        "1000",
    ];
    args.extend_from_slice(extra);
    let mut first = ChaosWorker::spawn(&db, &args);
    until_runs(&db, "some runs of the one-off keys", LONG, |runs| {
        runs.len() >= 30
    })
    .await;
    first.kill9();
    let second = ChaosWorker::spawn(&db, &args);
    until_all_ran(&db, "every one-off key's job to run", &once).await;
    until_all_ran(&db, "the gated job to start", &gated).await;
    wait_for("the one-off keys' rows to be swept", LONG, async || {
        let keys = slot_keys(&db).await;
        if keys == ["running", "scheduled"] {
            Ok(())
        } else {
            Err(format!("{} keys have rows", keys.len()))
        }
    })
    .await;
    let kept: i64 = db
        .scalar("SELECT count(*) FROM pgwake.key_slots WHERE limit_key IN ('running', 'scheduled')")
        .await;
    assert_eq!(kept, 4, "the kept keys keep rows 1..2");
    gate.open().await;
    c.execute(
        "UPDATE pgwake.jobs SET run_at = now() WHERE id = $1",
        &[&later],
    )
    .await
    .unwrap();
    until_all_ran(&db, "the scheduled job to run", &[later]).await;
    until_drained(&db).await;
    wait_for("the last keys' rows to be swept", LONG, async || {
        let keys = slot_keys(&db).await;
        if keys.is_empty() {
            Ok(())
        } else {
            Err(format!("{keys:?} have rows"))
        }
    })
    .await;
    second.terminate().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_slot_rows_of_keys_without_jobs_are_swept_tx() {
    the_slot_rows_of_keys_without_jobs_are_swept(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_slot_rows_of_keys_without_jobs_are_swept_lease() {
    the_slot_rows_of_keys_without_jobs_are_swept(&["--lease-handler"]).await;
}

/// The two ways a key can end up with a waiting job and no slot rows,
/// forced with two sessions and explicit transactions: (1) a job of key
/// `late` is inserted (its trigger finds the key's rows, so adds none)
/// while the rescuer's sweep deletes them, having not seen the uncommitted
/// job; (2) a job of key `new` of queue `tn2` is inserted (no limit: no
/// rows) while `--max-running-per-key` is set (the resize does not see the
/// uncommitted job). Worker processes then run both jobs: the claim
/// reports the keys and the worker adds their rows.
///
/// Teeth: without the report in `pgwake.fair_key_jobs` (the `have < lim`
/// branch, functions/claims.sql) neither job is ever claimed and the wait
/// for them fails.
async fn a_key_whose_rows_went_missing_is_repaired(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    queue_set(&db, &["tn", "--max-running-per-key", "2"]);
    let a = db.client().await;
    let b = db.client().await;
    // (1) The key has rows and, once its first job is gone, no job.
    let first = insert_keyed(&db, "tn", "work", Some("late"), 1).await;
    a.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&first[0]])
        .await
        .unwrap();
    a.batch_execute("BEGIN").await.unwrap();
    let late: i64 = a
        .query_one(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             VALUES ('tn', 'work', '{}', 'late') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let swept: i64 = b
        .query_one(
            "SELECT swept FROM pgwake.sweep_key_slots(NULL, NULL, 100)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(swept, 2, "the sweep saw no job of the key");
    a.batch_execute("COMMIT").await.unwrap();
    // (2) A limit set while the job's insert is uncommitted.
    a.batch_execute("BEGIN").await.unwrap();
    let new: i64 = a
        .query_one(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             VALUES ('tn2', 'work', '{}', 'new') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    b.execute("SELECT pgwake.set_queue_max_running_per_key('tn2', 2)", &[])
        .await
        .unwrap();
    a.batch_execute("COMMIT").await.unwrap();
    let rows: i64 = db
        .scalar("SELECT count(*) FROM pgwake.key_slots WHERE limit_key IN ('late', 'new')")
        .await;
    assert_eq!(rows, 0, "both keys have a waiting job and no rows");
    let mut args = vec!["--sleep-ms", "5"];
    args.extend_from_slice(extra);
    let workers: Vec<ChaosWorker> = (0..2).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    until_all_ran(&db, "the jobs of both keys to run", &[late, new]).await;
    for w in workers {
        w.terminate().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_whose_rows_went_missing_is_repaired_tx() {
    a_key_whose_rows_went_missing_is_repaired(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_whose_rows_went_missing_is_repaired_lease() {
    a_key_whose_rows_went_missing_is_repaired(&["--lease-handler"]).await;
}
