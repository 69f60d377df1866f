//! Rate limits per limit key (issue 24; `pgwake queue set Q --rate-per-key
//! N/s`, `pgwake.set_queue_rate_per_key()`, migration 0021): at most N jobs
//! of any one key of the queue are admitted in any window of its length,
//! across every worker process, in both delivery modes, through kill -9 and
//! retries; jobs without a key are not limited by it. Checked on the ledger
//! of admission and start times (database clock) written by the chaos
//! worker.
//!
//! Teeth: with the `y.last_start <= now() - win` condition taken out of
//! `pgwake.take_key_admission` (functions/claims.sql) a key's slots admit
//! again at once, and the first test fails (lease: 27 admissions of key `a`
//! within one second); with the `CONTINUE WHEN rated AND …` guard taken
//! out of `pgwake.fair_key_jobs`, claims take keyed jobs without admissions
//! and the first test fails (tx: runs of key `a` without an admission).

use crate::common;
use crate::queues::{insert_keyed, peak_running, queue_set, until_all_ran};

use std::time::Duration;

use common::*;

/// The most admissions of runs of `ids` in any half-open window
/// `[a, a + window)` that starts at one of them (the busiest window of any
/// placement starts at an admission), as `rate::busiest_window`.
async fn busiest_window(db: &TestDb, ids: &[i64], window: &str) -> i64 {
    db.client()
        .await
        .query_one(
            "SELECT coalesce(max((SELECT count(*) FROM pgwake_runs r2
                                  WHERE r2.job_id = ANY($1)
                                    AND r2.admitted_at >= r1.admitted_at
                                    AND r2.admitted_at < r1.admitted_at + $2::text::interval)), 0)
             FROM pgwake_runs r1 WHERE r1.job_id = ANY($1)",
            &[&ids, &window],
        )
        .await
        .unwrap()
        .get(0)
}

async fn count(db: &TestDb, sql: &str, ids: &[i64]) -> i64 {
    db.client()
        .await
        .query_one(sql, &[&ids])
        .await
        .unwrap()
        .get(0)
}

/// 5/s per key on queue `hooks`: keys `a` (25 jobs, 5 of them failing once:
/// their retries need a second admission), `b` and `c` (25 each), and 30
/// jobs without a key in the same queue; 3 worker processes of 8 places,
/// one killed (-9) mid-run and replaced. Ledger, per key: every run has an
/// admission, its handler started after it, no one-second window holds
/// more than 5 admissions, and the last run started at least (runs - 1) / 5
/// whole seconds after the workers did (the handlers' own clock). The
/// keyless jobs all ran, none with an admission, all before the keys'
/// backlog was done.
async fn key_rate_holds_across_workers_kills_and_retries(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN admitted_at timestamptz")
        .await
        .unwrap();
    queue_set(&db, &["hooks", "--rate-per-key", "5/s"]);
    let mut a = insert_keyed(&db, "hooks", "work", Some("a"), 20).await;
    a.extend(insert_keyed(&db, "hooks", "fail_once", Some("a"), 5).await);
    let b = insert_keyed(&db, "hooks", "work", Some("b"), 25).await;
    let c = insert_keyed(&db, "hooks", "work", Some("c"), 25).await;
    let keyless = insert_keyed(&db, "hooks", "work", None, 30).await;
    let started: String = db.scalar("SELECT clock_timestamp()::text").await;
    let mut args = vec![
        "--sleep-ms",
        "20",
        "--concurrency",
        "8",
        "--record-admitted",
        "--lease-ms",
        "1000",
        "--rescue-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    let mut workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let keyed: Vec<i64> = a.iter().chain(&b).chain(&c).copied().collect();
    let want: std::collections::HashSet<i64> = keyed.iter().copied().collect();
    until_runs(&db, "30 keyed runs", LONG, |runs| {
        runs.iter().filter(|r| want.contains(&r.0)).count() >= 30
    })
    .await;
    let killed = workers[0].pid();
    workers[0].kill9();
    workers.push(ChaosWorker::spawn(&db, &args));
    let all: Vec<i64> = keyed.iter().chain(&keyless).copied().collect();
    until_all_ran(&db, "every job to run", &all).await;
    until_drained(&db).await;
    for w in workers.drain(..) {
        if w.pid() != killed {
            w.terminate().await;
        }
    }

    for (name, ids) in [("a", &a), ("b", &b), ("c", &c)] {
        let runs = count(
            &db,
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1)",
            ids,
        )
        .await;
        assert!(runs >= 25, "only {runs} runs of key {name}");
        let unadmitted = count(
            &db,
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND admitted_at IS NULL",
            ids,
        )
        .await;
        assert_eq!(unadmitted, 0, "runs of key {name} without an admission");
        let early = count(
            &db,
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND at < admitted_at",
            ids,
        )
        .await;
        assert_eq!(
            early, 0,
            "a handler of key {name} started before its admission"
        );
        let busiest = busiest_window(&db, ids, "1 second").await;
        assert!(
            busiest <= 5,
            "{busiest} admissions of key {name} within one second, limit 5/s per key"
        );
        assert!(busiest >= 1);
        let spread: f64 = db
            .client()
            .await
            .query_one(
                "SELECT extract(epoch FROM max(at) - $2::text::timestamptz)::float8
                 FROM pgwake_runs WHERE job_id = ANY($1)",
                &[ids, &started],
            )
            .await
            .unwrap()
            .get(0);
        let floor = ((runs - 1) / 5) as f64;
        assert!(
            spread >= floor,
            "{runs} runs of key {name} at 5/s started within {spread:.2}s (at least {floor}s)"
        );
    }
    let a_retried = count(
        &db,
        "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND attempt > 1",
        &a,
    )
    .await;
    assert!(a_retried >= 5, "the fail_once jobs of key a ran again");

    // The keyless jobs: no admission, not held back by the keys' rate.
    let admitted = count(
        &db,
        "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND admitted_at IS NOT NULL",
        &keyless,
    )
    .await;
    assert_eq!(admitted, 0, "a job without a key took a per-key admission");
    let c2 = db.client().await;
    let behind: bool = c2
        .query_one(
            "SELECT (SELECT max(at) FROM pgwake_runs WHERE job_id = ANY($1))
                  < (SELECT max(at) FROM pgwake_runs WHERE job_id = ANY($2))",
            &[&keyless, &keyed],
        )
        .await
        .unwrap()
        .get(0);
    assert!(behind, "the keyless jobs waited behind the keys' rate");
    // One row per admission slot a key used, never more than its rate.
    let most: i64 = db
        .scalar("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pgwake.key_rate_slots GROUP BY limit_key) s")
        .await;
    assert!((1..=5).contains(&most), "{most} admission slots of one key");
}

const LONG: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread")]
async fn key_rate_holds_across_workers_kills_and_retries_tx() {
    key_rate_holds_across_workers_kills_and_retries(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn key_rate_holds_across_workers_kills_and_retries_lease() {
    key_rate_holds_across_workers_kills_and_retries(&["--lease-handler"]).await;
}

/// `--rate-per-key 4/s` with `--max-running-per-key 2` on one queue: both
/// hold per key (a claim takes a key's job only with an admission and a
/// free slot of the key). Two keys of 12 jobs of 300 ms, 2 workers.
async fn key_rate_and_per_key_max_running_hold_together(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute(
            "ALTER TABLE pgwake_runs ADD COLUMN admitted_at timestamptz,
                                     ADD COLUMN ended_at timestamptz",
        )
        .await
        .unwrap();
    queue_set(
        &db,
        &[
            "hooks",
            "--rate-per-key",
            "4/s",
            "--max-running-per-key",
            "2",
        ],
    );
    let a = insert_keyed(&db, "hooks", "work", Some("a"), 12).await;
    let b = insert_keyed(&db, "hooks", "work", Some("b"), 12).await;
    let mut args = vec!["--sleep-ms", "300", "--record-admitted", "--record-end"];
    args.extend_from_slice(extra);
    let workers: Vec<ChaosWorker> = (0..2).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let all: Vec<i64> = a.iter().chain(&b).copied().collect();
    until_all_ran(&db, "every job to run", &all).await;
    until_drained(&db).await;
    for w in workers {
        w.terminate().await;
    }
    for (name, ids) in [("a", &a), ("b", &b)] {
        let busiest = busiest_window(&db, ids, "1 second").await;
        assert!(
            busiest <= 4,
            "{busiest} admissions of key {name} within one second, limit 4/s"
        );
        let peak = peak_running(&db, ids, &[]).await;
        assert!(peak <= 2, "{peak} jobs of key {name} ran at once, limit 2");
        assert!(peak >= 1);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn key_rate_and_per_key_max_running_hold_together_tx() {
    key_rate_and_per_key_max_running_hold_together(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn key_rate_and_per_key_max_running_hold_together_lease() {
    key_rate_and_per_key_max_running_hold_together(&["--lease-handler"]).await;
}

/// The settings: CLI and SQL agree, bad values are refused naming the fix
/// and change nothing, `queue list` shows the rate, `--no-rate-per-key`
/// removes it and its slots, and changing it keeps each key's newest
/// admissions (no fresh burst).
#[tokio::test]
async fn key_rate_settings_are_validated_and_shown() {
    let db = migrated_db().await;
    let c = db.client().await;
    for bad in ["0/s", "5", "5/fortnight", "x/s", "100001/s"] {
        let out = run_pgwake(
            &["queue", "set", "hooks", "--rate-per-key", bad],
            Some(&db.url),
        );
        assert_eq!(out.status.code(), Some(2), "--rate-per-key {bad}");
        let err = stderr_of(&out);
        assert!(
            err.contains("invalid rate") && err.contains("20/s"),
            "{err}"
        );
    }
    let out = run_pgwake(
        &[
            "queue",
            "set",
            "hooks",
            "--rate-per-key",
            "5/s",
            "--no-rate-per-key",
        ],
        Some(&db.url),
    );
    assert_eq!(out.status.code(), Some(2));
    for bad in [
        "SELECT pgwake.set_queue_rate_per_key('hooks', 0)",
        "SELECT pgwake.set_queue_rate_per_key('hooks', 5, '0 s')",
        "SELECT pgwake.set_queue_rate_per_key('', 5)",
    ] {
        let e = c.batch_execute(bad).await.unwrap_err();
        assert!(
            format!("{:?}", e).contains("pgwake.set_queue_rate_per_key"),
            "{bad}: {e:?}"
        );
    }
    let rows: i64 = db.scalar("SELECT count(*) FROM pgwake.queues").await;
    assert_eq!(rows, 0, "a refused setting left a row");

    let out = run_pgwake(
        &["queue", "set", "hooks", "--rate-per-key", "600/min"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        said.contains("at most 600 jobs of any one limit key started in any 1m"),
        "{said}"
    );
    let list = pgwake::admin::queues::list(&c).await.unwrap();
    assert_eq!(
        list[0].rate_per_key.map(|r| r.to_string()),
        Some("600/min".into())
    );
    assert_eq!(list[0].rate, None);
    let out = run_pgwake(&["queue", "list"], Some(&db.url));
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        table.contains("RATE PER KEY") && table.contains("600/min"),
        "{table}"
    );
    let out = run_pgwake(&["queue", "list", "--json"], Some(&db.url));
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(json.contains("\"rate_per_key\": \"600/min\""), "{json}");
    // `pgwake stats` shows it too, in admissions per second of one key.
    let out = run_pgwake(&["stats", "--json"], Some(&db.url));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let hooks = stats
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "hooks")
        .unwrap();
    assert_eq!(hooks["limits"]["rate_per_key_per_second"], 10.0);
    let out = run_pgwake(&["stats"], Some(&db.url));
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(table.contains("per key: 10/s"), "{table}");

    // Key k: five admissions 1..5 seconds old; lowered to 2 per minute, the
    // two kept slots hold the two newest.
    c.batch_execute(
        "SELECT pgwake.set_queue_rate_per_key('hooks', 5, '1 minute');
         INSERT INTO pgwake.key_rate_slots (queue, limit_key, slot, last_start)
         SELECT 'hooks', 'k', g, now() - make_interval(secs => g) FROM generate_series(1, 5) g;",
    )
    .await
    .unwrap();
    pgwake::admin::queues::set_rate_per_key(&c, "hooks", Some("2/min".parse().unwrap()))
        .await
        .unwrap();
    let ages: Vec<f64> = c
        .query(
            "SELECT round(extract(epoch FROM now() - last_start))::float8
             FROM pgwake.key_rate_slots WHERE queue = 'hooks' AND limit_key = 'k' ORDER BY slot",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ages, vec![1.0, 2.0]);

    let out = run_pgwake(
        &["queue", "set", "hooks", "--no-rate-per-key"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(
        pgwake::admin::queues::list(&c).await.unwrap()[0].rate_per_key,
        None
    );
    let slots: i64 = db
        .scalar("SELECT count(*) FROM pgwake.key_rate_slots")
        .await;
    assert_eq!(slots, 0);
}

/// Two reservations that each create a new key's first admission slot in
/// their own open transaction never wait for each other: a reservation
/// whose key's slot row another one is inserting this instant passes the
/// key over (as `SKIP LOCKED` does), instead of waiting on the other's
/// uncommitted row. Waiting deadlocked workers whose rotations met in
/// opposite orders (CI saw `deadlock detected` from the reservation). A
/// `lock_timeout` makes any wait an error here, while the other
/// transaction stays open.
///
/// Teeth: without the `pgwake.key_rate_lock` guard in
/// `pgwake.take_key_admission`, A's reservation of `k2` waits on B's
/// uncommitted row and fails with `lock_timeout`.
#[tokio::test]
async fn reservations_creating_slot_rows_never_wait_for_each_other() {
    let db = migrated_db().await;
    let setup = db.client().await;
    setup
        .batch_execute("SELECT pgwake.set_queue_rate_per_key('kr', 5)")
        .await
        .unwrap();
    let (a, b) = (db.client().await, db.client().await);
    a.batch_execute("BEGIN; SET LOCAL lock_timeout = '2s'")
        .await
        .unwrap();
    b.batch_execute("BEGIN; SET LOCAL lock_timeout = '2s'")
        .await
        .unwrap();
    let take = "SELECT slot FROM pgwake.take_key_admission('kr', $1, 5, interval '1 second')";
    let slot = |row: tokio_postgres::Row| row.get::<_, Option<i32>>(0);
    assert_eq!(slot(a.query_one(take, &[&"k1"]).await.unwrap()), Some(1));
    assert_eq!(slot(b.query_one(take, &[&"k2"]).await.unwrap()), Some(1));
    // Each now asks for the key the other is creating.
    let a_k2 = a.query_one(take, &[&"k2"]).await.map(slot);
    let b_k1 = b.query_one(take, &[&"k1"]).await.map(slot);
    assert_eq!(
        a_k2.as_ref().map_err(|e| e.to_string()),
        Ok(&None),
        "A passes k2 over"
    );
    assert_eq!(
        b_k1.as_ref().map_err(|e| e.to_string()),
        Ok(&None),
        "B passes k1 over"
    );
    a.batch_execute("COMMIT").await.unwrap();
    b.batch_execute("COMMIT").await.unwrap();
    // Once both committed, each key has its row and admits again (up to 5).
    let c = db.client().await;
    assert_eq!(slot(c.query_one(take, &[&"k1"]).await.unwrap()), Some(2));
    assert_eq!(slot(c.query_one(take, &[&"k2"]).await.unwrap()), Some(2));
}
