//! Rate limits (`pgwake queue set Q --rate N/s`, `pgwake.set_queue_rate()`,
//! migration 0010): at most N jobs of the queue are admitted in any window
//! of its length, across every worker process, through kill -9, retries and
//! the suspects' one-job claim. Each worker test ends with a ledger check
//! on database timestamps.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(180);

/// `n` jobs of `task` in `queue`; their ids.
async fn insert(db: &TestDb, queue: &str, task: &str, n: i32) -> Vec<i64> {
    db.client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload)
             SELECT $1, $2, jsonb_build_object('n', g) FROM generate_series(1, $3) g
             RETURNING id",
            &[&queue, &task, &n],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The most admissions of `queue`'s runs in any half-open window
/// `[a, a + window)` that starts at one of them (the busiest window of any
/// placement starts at an admission).
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

/// 20/s on queue `api`: 3 worker processes of 16 slots each, one killed
/// (-9) mid-run and replaced, some jobs failing once (their retries need a
/// second admission); an unlimited queue beside it. Ledger: every run of
/// `api` has an admission time, the handler started after it, and no window
/// of one second holds more than 20 admissions; the last run started at
/// least (runs - 1) / 20 whole seconds after the workers did (this one reads
/// only the handlers' own clock_timestamp()). Runs of the unlimited queue
/// have no admission. Every admission slot's last use is within the test.
///
/// Taking the `last_start <= now() - rate_window` condition out of
/// rate_reserve.sql admits the whole backlog at once: the busiest window
/// then holds every run.
async fn rate_holds_across_workers_kills_and_retries(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    db.client()
        .await
        .batch_execute("ALTER TABLE pgwake_runs ADD COLUMN admitted_at timestamptz")
        .await
        .unwrap();
    let out = run_pgwake(&["queue", "set", "api", "--rate", "20/s"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let mut api = insert(&db, "api", "work", 90).await;
    api.extend(insert(&db, "api", "fail_once", 10).await);
    let free = insert(&db, "free", "work", 100).await;
    let started: String = db.scalar("SELECT clock_timestamp()::text").await;
    let mut args = vec![
        "--sleep-ms",
        "30",
        "--concurrency",
        "16",
        "--record-admitted",
        "--lease-ms",
        "1000",
        "--rescue-ms",
        "200",
    ];
    args.extend_from_slice(extra);
    let mut workers: Vec<ChaosWorker> = (0..3).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let want: HashSet<i64> = api.iter().copied().collect();
    until_runs(&db, "40 runs of the rate-limited queue", LONG, |runs| {
        runs.iter().filter(|r| want.contains(&r.0)).count() >= 40
    })
    .await;
    let killed = workers[0].pid();
    workers[0].kill9();
    workers.push(ChaosWorker::spawn(&db, &args));
    until_drained(&db).await;
    for w in workers.drain(..) {
        if w.pid() != killed {
            w.terminate().await;
        }
    }

    let c = db.client().await;
    let runs: i64 = c
        .query_one(
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1)",
            &[&api],
        )
        .await
        .unwrap()
        .get(0);
    // Every job ran; the ten fail_once jobs at least twice.
    assert!(runs >= 110, "only {runs} runs of the rate-limited queue");
    let unadmitted: i64 = c
        .query_one(
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND admitted_at IS NULL",
            &[&api],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        unadmitted, 0,
        "runs of a rate-limited queue without an admission"
    );
    let early: i64 = c
        .query_one(
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND at < admitted_at",
            &[&api],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(early, 0, "a handler started before its admission");
    let busiest = busiest_window(&db, &api, "1 second").await;
    assert!(
        busiest <= 20,
        "{busiest} admissions within one second, limit 20/s"
    );
    assert!(busiest >= 1);
    // From the handlers' own start times alone.
    let spread: f64 = c
        .query_one(
            "SELECT extract(epoch FROM max(at) - $2::text::timestamptz)::float8
             FROM pgwake_runs WHERE job_id = ANY($1)",
            &[&api, &started],
        )
        .await
        .unwrap()
        .get(0);
    let floor = ((runs - 1) / 20) as f64;
    assert!(
        spread >= floor,
        "{runs} runs at 20/s started within {spread:.2}s of the workers' start (at least {floor}s)"
    );
    let free_admitted: i64 = c
        .query_one(
            "SELECT count(*) FROM pgwake_runs WHERE job_id = ANY($1) AND admitted_at IS NOT NULL",
            &[&free],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        free_admitted, 0,
        "an unlimited queue's run has an admission"
    );
    let free_ran: i64 = c
        .query_one(
            "SELECT count(DISTINCT job_id) FROM pgwake_runs WHERE job_id = ANY($1)",
            &[&free],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(free_ran, 100);
    let slots: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queue_rate_slots WHERE queue = 'api'")
        .await;
    assert_eq!(slots, 20);
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_holds_across_workers_kills_and_retries_tx() {
    rate_holds_across_workers_kills_and_retries(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_holds_across_workers_kills_and_retries_lease() {
    rate_holds_across_workers_kills_and_retries(&["--lease-handler"]).await;
}

/// `--rate` with `--max-running` on one queue: both hold (the claim takes at
/// most as many jobs as it has admissions and free slots). 5 per second, at
/// most 2 at once, jobs of up to 300 ms.
#[tokio::test(flavor = "multi_thread")]
async fn rate_and_max_running_hold_together() {
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
    let out = run_pgwake(
        &["queue", "set", "api", "--rate", "5/s", "--max-running", "2"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let ids = insert(&db, "api", "work", 20).await;
    let args = [
        "--sleep-ms",
        "300",
        "--record-admitted",
        "--record-end",
        "--lease-handler",
    ];
    let workers: Vec<ChaosWorker> = (0..2).map(|_| ChaosWorker::spawn(&db, &args)).collect();
    let want: HashSet<i64> = ids.iter().copied().collect();
    until_runs(&db, "every job to run", LONG, |runs| {
        runs.iter()
            .map(|r| r.0)
            .collect::<HashSet<_>>()
            .is_superset(&want)
    })
    .await;
    for w in workers {
        w.terminate().await;
    }
    let busiest = busiest_window(&db, &ids, "1 second").await;
    assert!(
        busiest <= 5,
        "{busiest} admissions within one second, limit 5/s"
    );
    // Peak running from start/end times: runs alive at each start.
    let peak: i64 = db
        .scalar(
            "SELECT max((SELECT count(*) FROM pgwake_runs r2
                         WHERE r2.at <= r1.at AND (r2.ended_at IS NULL OR r2.ended_at > r1.at)))
             FROM pgwake_runs r1",
        )
        .await;
    assert!(peak <= 2, "{peak} running at once, limit 2");
}

/// The settings: CLI and SQL agree, bad values are refused with a reason
/// and change nothing, `--no-rate` removes the limit and its slots, and
/// lowering the rate keeps the newest admissions (no fresh burst).
#[tokio::test]
async fn rate_settings_are_validated_and_lowering_keeps_the_newest_admissions() {
    let db = migrated_db().await;
    let c = db.client().await;
    for bad in ["0/s", "20", "20/fortnight", "x/s", "100001/s"] {
        let out = run_pgwake(&["queue", "set", "api", "--rate", bad], Some(&db.url));
        assert_eq!(out.status.code(), Some(2), "--rate {bad}");
        assert!(
            stderr_of(&out).contains("invalid rate"),
            "{}",
            stderr_of(&out)
        );
    }
    for bad in [
        "SELECT pgwake.set_queue_rate('api', 0)",
        "SELECT pgwake.set_queue_rate('api', 5, '0 s')",
        "SELECT pgwake.set_queue_rate('', 5)",
    ] {
        assert!(c.batch_execute(bad).await.is_err(), "{bad}");
    }
    let rows: i64 = db.scalar("SELECT count(*) FROM pgwake.queues").await;
    assert_eq!(rows, 0, "a refused setting left a row");

    let out = run_pgwake(&["queue", "set", "api", "--rate", "600/min"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("at most 600 started in any 1m"));
    let list = pgwake::admin::queues::list(&c).await.unwrap();
    assert_eq!(list[0].rate.map(|r| r.to_string()), Some("600/min".into()));
    let out = run_pgwake(&["queue", "list"], Some(&db.url));
    assert!(String::from_utf8_lossy(&out.stdout).contains("600/min"));
    let out = run_pgwake(&["queue", "list", "--json"], Some(&db.url));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("\"rate\": \"600/min\""),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // Five slots with admissions 1..5 seconds old, then lower to 2: the two
    // kept slots hold the two newest.
    c.batch_execute(
        "SELECT pgwake.set_queue_rate('api', 5, '1 minute');
         UPDATE pgwake.queue_rate_slots SET last_start = now() - make_interval(secs => slot);",
    )
    .await
    .unwrap();
    pgwake::admin::queues::set_rate(&c, "api", Some("2/min".parse().unwrap()))
        .await
        .unwrap();
    let ages: Vec<f64> = c
        .query(
            "SELECT round(extract(epoch FROM now() - last_start))::float8
             FROM pgwake.queue_rate_slots WHERE queue = 'api' ORDER BY slot",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ages, vec![1.0, 2.0]);
    // Raising adds free slots.
    pgwake::admin::queues::set_rate(&c, "api", Some("4/min".parse().unwrap()))
        .await
        .unwrap();
    let free: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queue_rate_slots WHERE last_start = '-infinity'")
        .await;
    assert_eq!(free, 2);

    let out = run_pgwake(&["queue", "set", "api", "--no-rate"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(pgwake::admin::queues::list(&c).await.unwrap()[0].rate, None);
    let slots: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queue_rate_slots")
        .await;
    assert_eq!(slots, 0);
}

/// A worker that has not yet seen a new rate limit (it re-reads the limited
/// queues every few rounds) claims nothing of the queue: the plain claim
/// skips rate-limited queues, and the limited claim without admissions
/// takes nothing. Only admissions let jobs through, and one given back
/// frees its slot at once.
#[tokio::test]
async fn claims_without_admissions_take_nothing_of_a_rate_limited_queue() {
    let db = migrated_db().await;
    let c = db.client().await;
    insert(&db, "api", "work", 5).await;
    c.batch_execute("SELECT pgwake.set_queue_rate('api', 2)")
        .await
        .unwrap();
    let none: Option<Vec<String>> = None;
    let empty: Vec<String> = vec![];
    let db_ = pgwake::internal::sql::Db::unnamed(&c);
    let plain = db_
        .query(
            &pgwake::internal::sql::CLAIM_LEASE_QUEUE,
            &[&10i64, &"api", &none, &empty, &"w", &60.0f64, &10i64],
        )
        .await
        .unwrap();
    assert_eq!(
        plain.len(),
        0,
        "the plain claim took jobs of a rate-limited queue"
    );
    let no_cap: Option<i64> = None;
    let limited = db_
        .query(
            &pgwake::internal::sql::CLAIM_LEASE_LIMITED,
            &[
                &10i64,
                &"api",
                &none,
                &empty,
                &"w",
                &60.0f64,
                &no_cap,
                &None::<String>,
                &None::<Vec<String>>,
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        limited.len(),
        0,
        "the limited claim without admissions took jobs"
    );

    // Admissions: 2 of 2 slots, ready 5 → the next free slot is a window
    // away.
    let reserve = async || {
        db_.query_one(
            &pgwake::internal::sql::RATE_RESERVE,
            &[&Some("api"), &10i64, &None::<i64>],
        )
        .await
        .unwrap()
    };
    let row = reserve().await;
    let slots: Vec<i32> = row.get(2);
    assert_eq!(slots, vec![1, 2]);
    let next_free: Option<std::time::SystemTime> = row.get(5);
    assert!(next_free.is_some());
    let at: std::time::SystemTime = row.get(3);
    let claimed = db_
        .query(
            &pgwake::internal::sql::CLAIM_LEASE_LIMITED,
            &[
                &10i64,
                &"api",
                &none,
                &empty,
                &"w",
                &60.0f64,
                &Some(1i64),
                &None::<String>,
                &None::<Vec<String>>,
            ],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "one admission used");
    // The unused one is given back: free again, the used one is not.
    db_.execute(
        &pgwake::internal::sql::RATE_RELEASE,
        &[&"api", &vec![2i32], &at],
    )
    .await
    .unwrap();
    let slots: Vec<i32> = reserve().await.get(2);
    assert_eq!(
        slots,
        vec![2],
        "the given-back slot admits again, the used one not"
    );
    // A second give-back of the same admission changes nothing.
    let n = db_
        .execute(
            &pgwake::internal::sql::RATE_RELEASE,
            &[&"api", &vec![2i32], &at],
        )
        .await
        .unwrap();
    assert_eq!(n, 0);
}
