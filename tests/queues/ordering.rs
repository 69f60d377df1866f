//! Ordered keys (`ordering_key`): jobs of one key run one at a time, in
//! (priority, run_at, id) order fixed at enqueue, across worker processes
//! and both delivery modes; a failed job keeps its place (its successors
//! wait for its retry), a dead one unblocks its key, and a worker killed
//! mid-job never leaves its key blocked.
//!
//! The workers are `chaos_worker` processes: each run is recorded in
//! `pgwake_runs` with `overlap` set when another run of the same key (the
//! payload's `lock`) was alive at its start (tests/common/chaos.rs). Last, the
//! history (finished_jobs) records both keys, in both modes.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;

/// Every job: (id, ordering key, priority) — enqueue order is id order.
async fn jobs_by_key(db: &TestDb) -> HashMap<i64, (String, i32)> {
    db.client()
        .await
        .query(
            "SELECT id, ordering_key, priority FROM pgwake.jobs WHERE ordering_key IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect()
}

/// Enqueue `per_key` jobs for each of `keys` keys, interleaved, with
/// priorities that disagree with enqueue order inside a key (so the order
/// checked is (priority, run_at, id), not id).
async fn enqueue_keyed(db: &TestDb, keys: usize, per_key: usize, task: &str) {
    db.client()
        .await
        .execute(
            "INSERT INTO pgwake.jobs (task, payload, ordering_key, priority)
             SELECT $1, jsonb_build_object('lock', 'key' || k), 'key' || k, (i % 3)
             FROM generate_series(1, $3::int) i, generate_series(1, $2::int) k
             ORDER BY i, k",
            &[&task, &(keys as i32), &(per_key as i32)],
        )
        .await
        .unwrap();
}

/// The ledger check. Per key, the runs (in start order) must follow the
/// jobs' (priority, id) order — a job's retries right after its failed run,
/// before any later job of its key — with every job run, and none of them
/// overlapping another run of its key (except the run right after a run of
/// `killed`, whose advisory lock the server may release a moment after the
/// claim it held was rolled back).
fn check_ledger(
    jobs: &HashMap<i64, (String, i32)>,
    runs: &[(i64, i32, i32, bool)],
    dead: &[i64],
    killed: Option<i32>,
) {
    let mut by_key: HashMap<&str, Vec<&(i64, i32, i32, bool)>> = HashMap::new();
    for run in runs {
        let (key, _) = &jobs[&run.0];
        by_key.entry(key.as_str()).or_default().push(run);
    }
    for (key, key_runs) in &by_key {
        let mut previous_pid = None;
        for run in key_runs {
            assert!(
                !run.3 || (killed.is_some() && previous_pid == killed),
                "key {key}: job {} (attempt {}) started while another job of its key ran: {key_runs:?}",
                run.0,
                run.1
            );
            previous_pid = Some(run.2);
        }
        // The order the runs took, each job once.
        let mut order: Vec<i64> = key_runs.iter().map(|r| r.0).collect();
        order.dedup();
        let mut expected: Vec<i64> = jobs
            .iter()
            .filter(|(_, (k, _))| k == key)
            .map(|(id, _)| *id)
            .collect();
        expected.sort_by_key(|id| (jobs[id].1, *id));
        assert_eq!(
            order, expected,
            "key {key}: runs out of order: {key_runs:?}"
        );
    }
    let ran: std::collections::HashSet<i64> = runs.iter().map(|r| r.0).collect();
    for id in jobs.keys() {
        assert!(ran.contains(id), "job {id} never ran");
    }
    for id in dead {
        assert_eq!(
            runs.iter().filter(|r| r.0 == *id).count(),
            1,
            "dead job {id} ran once (max_attempts 1)"
        );
    }
}

async fn keys_run_in_order_across_three_workers(lease: bool) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    // 20 keys × 8 jobs, one in five runs failing at random (`flaky`), and
    // a key whose first job fails once (its successors wait for the retry)
    // and one whose first job dies (it unblocks its key).
    enqueue_keyed(&db, 20, 8, "flaky").await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgwake.jobs (task, payload, ordering_key, max_attempts)
             VALUES ('fail_once', '{\"lock\": \"retry\"}', 'retry', 25),
                    ('work', '{\"lock\": \"retry\"}', 'retry', 25),
                    ('work', '{\"lock\": \"retry\"}', 'retry', 25),
                    ('fail', '{\"lock\": \"dead\"}', 'dead', 1),
                    ('work', '{\"lock\": \"dead\"}', 'dead', 25),
                    ('work', '{\"lock\": \"dead\"}', 'dead', 25)",
        )
        .await
        .unwrap();
    let jobs = jobs_by_key(&db).await;
    let dead: Vec<i64> = client
        .query("SELECT id FROM pgwake.jobs WHERE task = 'fail'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mode: &[&str] = if lease { &["--lease"] } else { &[] };
    let workers: Vec<ChaosWorker> = (0..3)
        .map(|_| {
            ChaosWorker::spawn(
                &db,
                &[mode, &["--concurrency", "8", "--batch", "4"]].concat(),
            )
        })
        .collect();
    until_drained(&db).await;
    for w in workers {
        assert!(w.terminate().await.success());
    }
    let runs = ledger_runs(&db).await;
    check_ledger(&jobs, &runs, &dead, None);
    // The job that failed once ran twice, both before its successors.
    let retried: Vec<i32> = runs
        .iter()
        .filter(|r| jobs[&r.0].0 == "retry")
        .map(|r| r.1)
        .collect();
    assert_eq!(&retried[..2], &[1, 2], "{retried:?}");
    let dead_rows: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead_rows, 1);
}

#[tokio::test]
async fn tx_mode_keys_never_overlap_and_run_in_order_across_three_workers() {
    keys_run_in_order_across_three_workers(false).await;
}

#[tokio::test]
async fn lease_mode_keys_never_overlap_and_run_in_order_across_three_workers() {
    keys_run_in_order_across_three_workers(true).await;
}

async fn killed_worker_does_not_block_its_key(lease: bool) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    // `block` hangs on its first attempt: the worker running it is killed.
    db.client()
        .await
        .batch_execute(
            "INSERT INTO pgwake.jobs (task, payload, ordering_key)
             VALUES ('block', '{\"lock\": \"k\"}', 'k'),
                    ('work', '{\"lock\": \"k\"}', 'k'),
                    ('work', '{\"lock\": \"k\"}', 'k')",
        )
        .await
        .unwrap();
    let jobs = jobs_by_key(&db).await;
    let mode: &[&str] = if lease {
        &["--lease", "--lease-ms", "1000"]
    } else {
        &[]
    };
    let mut first = ChaosWorker::spawn(&db, mode);
    until_runs(
        &db,
        "the blocking job to start",
        Duration::from_secs(60),
        |runs| !runs.is_empty(),
    )
    .await;
    let killed = first.pid();
    first.kill9();
    let others: Vec<ChaosWorker> = (0..2).map(|_| ChaosWorker::spawn(&db, mode)).collect();
    until_drained(&db).await;
    for w in others {
        assert!(w.terminate().await.success());
    }
    let runs = ledger_runs(&db).await;
    check_ledger(&jobs, &runs, &[], Some(killed));
    assert_eq!(runs[0].2, killed);
    assert_eq!((runs[1].0, runs[1].1), (runs[0].0, 2), "{runs:?}");
}

#[tokio::test]
async fn tx_mode_a_worker_killed_mid_job_does_not_leave_its_key_blocked() {
    killed_worker_does_not_block_its_key(false).await;
}

#[tokio::test]
async fn lease_mode_a_worker_killed_mid_job_does_not_leave_its_key_blocked() {
    killed_worker_does_not_block_its_key(true).await;
}

#[tokio::test]
async fn a_job_enqueued_ahead_of_a_running_one_waits_for_it() {
    // A job of the key with a lower priority than the running one comes
    // before it, yet must not start while it runs (tx mode: the running
    // claim holds the key's lock; lease mode: leased_jobs shows it).
    let db = migrated_db().await;
    let a = db.client().await;
    let b = db.client().await;
    a.batch_execute("INSERT INTO pgwake.jobs (task, ordering_key, priority) VALUES ('t', 'k', 5)")
        .await
        .unwrap();
    a.batch_execute("BEGIN").await.unwrap();
    let first = claim_tx_all(&a).await;
    assert_eq!(first.len(), 1);
    b.batch_execute("INSERT INTO pgwake.jobs (task, ordering_key, priority) VALUES ('t', 'k', 0)")
        .await
        .unwrap();
    b.batch_execute("BEGIN").await.unwrap();
    let second = claim_tx_all(&b).await;
    assert!(second.is_empty(), "claimed while its key runs");
    b.batch_execute("ROLLBACK").await.unwrap();
    let lease = claim_lease_all(&b, "w").await;
    assert!(lease.is_empty(), "leased while its key runs");
    // The running job ends: the waiting one may start.
    a.batch_execute("COMMIT").await.unwrap();
    let lease = claim_lease_all(&b, "w").await;
    assert_eq!(lease.len(), 1);
    // And while it is leased, nothing else of the key starts in tx mode.
    b.batch_execute("INSERT INTO pgwake.jobs (task, ordering_key, priority) VALUES ('t', 'k', -5)")
        .await
        .unwrap();
    a.batch_execute("BEGIN").await.unwrap();
    let third = claim_tx_all(&a).await;
    assert!(third.is_empty(), "claimed while its key is leased");
    a.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn lease_mode_the_next_job_of_a_key_starts_without_waiting_for_the_poll() {
    // No INSERT announces that a key's next job became free when the
    // running one finishes: the worker that finished it claims again. With
    // a poll of ten minutes, the key drains only through that wake-up.
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let worker = ChaosWorker::spawn(&db, &["--lease", "--poll-ms", "600000"]);
    // Inserted after the worker listens: the NOTIFY wakes it for the first.
    until_waiting_worker(&db).await;
    // The jobs as inserted (the worker may take them before a later read).
    let jobs: HashMap<i64, (String, i32)> = db
        .client()
        .await
        .query(
            "INSERT INTO pgwake.jobs (task, payload, ordering_key)
             SELECT 'work', '{\"lock\": \"k\"}', 'k' FROM generate_series(1, 5)
             RETURNING id, ordering_key, priority",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    until_drained(&db).await;
    assert!(worker.terminate().await.success());
    check_ledger(&jobs, &ledger_runs(&db).await, &[], None);
}

/// Until some worker is registered as waiting (listening, idle).
async fn until_waiting_worker(db: &TestDb) {
    eventually(
        "a worker to wait for jobs",
        Duration::from_secs(60),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM pgwake.waiting_workers")
                .await
                > 0
        },
    )
    .await;
}

async fn history_records_the_keys(lease: bool) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    client
        .batch_execute(
            "UPDATE pgwake.history_settings SET keep = interval '1 day';
             INSERT INTO pgwake.jobs (task, payload, ordering_key, unique_key, max_attempts)
             VALUES ('work', '{}', 'o1', 'u1', 25), ('fail', '{}', 'o2', 'u2', 1)",
        )
        .await
        .unwrap();
    let mode: &[&str] = if lease { &["--lease"] } else { &[] };
    let worker = ChaosWorker::spawn(&db, mode);
    until_drained(&db).await;
    assert!(worker.terminate().await.success());
    let rows: Vec<(String, Option<String>, Option<String>)> = client
        .query(
            "SELECT outcome, ordering_key, unique_key FROM pgwake.finished_jobs ORDER BY outcome",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let some = |s: &str| Some(s.to_string());
    assert_eq!(
        rows,
        vec![
            ("dead".to_string(), some("o2"), some("u2")),
            ("done".to_string(), some("o1"), some("u1")),
        ]
    );
}

#[tokio::test]
async fn tx_mode_history_records_the_keys() {
    history_records_the_keys(false).await;
}

#[tokio::test]
async fn lease_mode_history_records_the_keys() {
    history_records_the_keys(true).await;
}

/// One lease claim (up to 10 jobs, any queue): the claimed (id, token)s.
async fn lease_claim(c: &tokio_postgres::Client) -> Vec<(i64, i64)> {
    claim_lease_all(c, "w")
        .await
        .iter()
        .map(|r| (r.get(0), r.get(12)))
        .collect()
}

#[tokio::test]
async fn a_dead_job_brought_back_takes_its_old_place_after_the_running_one() {
    let db = migrated_db().await;
    let c = db.client().await;
    let ids: Vec<i64> = c
        .query(
            "INSERT INTO pgwake.jobs (task, ordering_key) SELECT 't', 'k' FROM generate_series(1, 3)
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The first dies (cancelled while waiting): the key goes on with the second.
    c.query_one("SELECT pgwake.cancel($1)", &[&ids[0]])
        .await
        .unwrap();
    let running = lease_claim(&c).await;
    assert_eq!(
        running.iter().map(|r| r.0).collect::<Vec<_>>(),
        vec![ids[1]]
    );
    // Brought back while the second runs: it comes before the third, but
    // waits for the running one.
    let revived = run_pgwake(
        &["dead", "retry", "--id", &ids[0].to_string()],
        Some(&db.url),
    );
    assert!(revived.status.success(), "{}", stderr_of(&revived));
    assert!(
        lease_claim(&c).await.is_empty(),
        "a job started beside a running one of its key"
    );
    let done = pgwake::internal::sql::Db::unnamed(&c)
        .query(&pgwake::internal::sql::LEASE_DONE, &[&vec![running[0].1]])
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
    // Then it runs, before the third.
    let next = lease_claim(&c).await;
    assert_eq!(next.iter().map(|r| r.0).collect::<Vec<_>>(), vec![ids[0]]);
}
