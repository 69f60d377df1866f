//! Batches with a callback (issue 36, item 4; docs/src/flows.md →
//! "Batches"): a callback job that waits for every job of its batch, added
//! over several transactions, and runs once after the last has ended,
//! whatever their outcomes, with a summary (counts by outcome, the failed
//! ids); in both delivery modes, with several workers, and across a kill -9
//! of a worker. The fan-in is counted, not decremented per job: the work of
//! ending 10,000 jobs of one batch in one transaction is counted (rows
//! updated, scans), never timed. (tests/jobs/batches.rs is about the
//! worker's batched writes, not these batches.)

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use pgwake::client::{batch_close, batch_open, batch_status, enqueue, BatchStatus, NewJob};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

/// Open a batch whose callback is a job of task `report`.
async fn open(c: &tokio_postgres::Client) -> i64 {
    batch_open(
        c,
        "report",
        &serde_json::json!({"import": 7}),
        None,
        pgwake::client::BATCH_CLOSE_WITHIN_DEFAULT,
    )
    .await
    .unwrap()
}

/// Add `n` jobs of `task` to batch `b`, in one statement.
async fn add(c: &tokio_postgres::Client, b: i64, task: &str, n: i64) -> Vec<i64> {
    c.query(
        "SELECT pgwake.enqueue($1, '{}', batch => $2) FROM generate_series(1, $3::int8)",
        &[&task, &b, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

async fn callback_held(db: &TestDb, b: i64) -> bool {
    let c = db.client().await;
    c.query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&b])
        .await
        .unwrap()
        .get(0)
}

/// Ended jobs (removed, as a done job is) do not release the callback while
/// the batch is open; closing it then releases it in the close's commit;
/// the summary counts them. An empty batch closed is released at once.
/// (Without close_batch's release, the callback stays held after the close.)
#[tokio::test]
async fn closing_after_the_last_job_ended_releases_the_callback_at_once() {
    let db = migrated_db().await;
    let c = db.client().await;
    let b = open(&c).await;
    let jobs = add(&c, b, "t", 3).await;
    c.execute("DELETE FROM pgwake.jobs WHERE id = ANY($1)", &[&jobs])
        .await
        .unwrap();
    assert!(callback_held(&db, b).await, "held while the batch is open");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (
            s.state.as_str(),
            s.callback.as_str(),
            s.total,
            s.done,
            s.pending
        ),
        ("open", "held", 3, 3, 0),
        "{s:?}"
    );
    assert!(batch_close(&c, b).await.unwrap());
    assert!(!callback_held(&db, b).await, "released by the close");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (s.state.as_str(), s.callback.as_str()),
        ("released", "waiting")
    );
    // A second close changes nothing.
    assert!(!batch_close(&c, b).await.unwrap());

    let empty = open(&c).await;
    assert!(batch_close(&c, empty).await.unwrap());
    assert!(
        !callback_held(&db, empty).await,
        "an empty batch closed runs at once"
    );
    let s = batch_status(&c, empty).await.unwrap();
    assert_eq!((s.total, s.state.as_str()), (0, "released"));
}

/// Closed first, the batch's callback is released in the commit that ends
/// its last job, not before; jobs added over several transactions all
/// count. (Without batch_apply's release, the callback stays held.)
#[tokio::test]
async fn closing_before_the_last_job_ended_releases_it_with_the_last() {
    let db = migrated_db().await;
    let mut c = db.client().await;
    let b = open(&c).await;
    let mut jobs = Vec::new();
    for _ in 0..3 {
        let tx = c.transaction().await.unwrap();
        let ids: Vec<i64> = tx
            .query(
                "SELECT pgwake.enqueue('t', '{}', batch => $1) FROM generate_series(1, 4)",
                &[&b],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        tx.commit().await.unwrap();
        jobs.extend(ids);
    }
    assert!(batch_close(&c, b).await.unwrap());
    let (last, rest) = jobs.split_last().unwrap();
    c.execute("DELETE FROM pgwake.jobs WHERE id = ANY($1)", &[&rest])
        .await
        .unwrap();
    assert!(callback_held(&db, b).await, "one job left");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (s.state.as_str(), s.total, s.done, s.pending),
        ("closed", 12, 11, 1)
    );
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[last])
        .await
        .unwrap();
    assert!(!callback_held(&db, b).await, "released with the last");
}

/// Bad input is refused with an error naming the fix, and nothing is
/// added: an unknown batch, a job that is no batch, a closed batch, the
/// 100,001st job (the committed count set near the bound), a close_within
/// out of range. (Without batch_add's bound, the last add succeeds.)
#[tokio::test]
async fn bad_batches_are_refused() {
    let db = migrated_db().await;
    let c = db.client().await;
    let refusal = async |sql: &str| -> String {
        let e = c.batch_execute(sql).await.unwrap_err();
        let db = e.as_db_error().unwrap();
        format!("{} ({})", db.message(), db.hint().unwrap_or(""))
    };
    let e = refusal("SELECT pgwake.enqueue('t', batch => 987654)").await;
    assert!(e.contains("batch 987654 does not exist"), "{e}");
    let plain = enqueue(&c, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let e = refusal(&format!("SELECT pgwake.enqueue('t', batch => {plain})")).await;
    assert!(e.contains(&format!("job {plain} is not a batch")), "{e}");
    let e = batch_status(&c, plain).await.unwrap_err().to_string();
    assert!(e.contains("is not a batch"), "{e}");

    let b = open(&c).await;
    batch_close(&c, b).await.unwrap();
    let e = refusal(&format!("SELECT pgwake.enqueue('t', batch => {b})")).await;
    assert!(e.contains(&format!("batch {b} is closed")), "{e}");
    assert!(e.contains("Open a new batch"), "{e}");

    let b = open(&c).await;
    c.execute(
        "UPDATE pgwake.batches SET added = pgwake.max_batch_jobs() - 1 WHERE id = $1",
        &[&b],
    )
    .await
    .unwrap();
    c.execute("SELECT pgwake.enqueue('t', batch => $1)", &[&b])
        .await
        .unwrap();
    let e = refusal(&format!("SELECT pgwake.enqueue('t', batch => {b})")).await;
    assert!(
        e.contains("has 100000 jobs: at most 100000 are allowed"),
        "{e}"
    );
    let n: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.job_parents WHERE child = {b}"
        ))
        .await;
    assert_eq!(n, 1, "the refused job left nothing");

    let e = refusal("SELECT pgwake.batch_open('r', close_within => interval '0 s')").await;
    assert!(e.contains("close_within"), "{e}");
}

/// A batch whose callback is cancelled: its jobs run on, nothing more can
/// be added, the status says so. A dead batch job retried after the
/// release runs again; the summary the callback was released with stays.
#[tokio::test]
async fn cancelled_callbacks_and_retried_jobs() {
    let db = migrated_db().await;
    let c = db.client().await;
    let b = open(&c).await;
    let jobs = add(&c, b, "t", 2).await;
    let r: String = c
        .query_one("SELECT pgwake.cancel($1)", &[&b])
        .await
        .unwrap()
        .get(0);
    assert_eq!(r, "cancelled", "{r}");
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!((s.callback.as_str(), s.pending), ("cancelled", 2));
    let e = c
        .batch_execute(&format!("SELECT pgwake.enqueue('t', batch => {b})"))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("callback was cancelled"), "{e:?}");
    let waiting: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE NOT held")
        .await;
    assert_eq!(waiting, 2, "its jobs still wait to run");

    // Retry of a dead job after the release.
    let b = open(&c).await;
    let jobs2 = add(&c, b, "t", 2).await;
    c.execute(
        "WITH d AS (DELETE FROM pgwake.jobs WHERE id = $1 RETURNING *)
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                                       max_attempts, last_error, created_at)
         SELECT id, queue, task, payload, priority, run_at, 1, 1, 'boom', created_at FROM d",
        &[&jobs2[0]],
    )
    .await
    .unwrap();
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&jobs2[1]])
        .await
        .unwrap();
    batch_close(&c, b).await.unwrap();
    let before = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (before.done, before.dead, before.failed_ids.clone()),
        (1, 1, vec![jobs2[0]])
    );
    let retried = pgwake::admin::dead::retry(
        &c,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![jobs2[0]]),
            queue: None,
            all: false,
        },
    )
    .await
    .unwrap();
    assert_eq!(retried, vec![jobs2[0]]);
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&jobs2[0]])
        .await
        .unwrap();
    let after = batch_status(&c, b).await.unwrap();
    assert_eq!(after, before, "the summary of the release stays");
    let _ = jobs;
}

/// 10,000 jobs added to a batch in one transaction, then ended in one
/// transaction: the batch's row is updated once for the adds, and at most
/// twice for the ends (their count, the release), the callback's row once
/// (its release), and no table is scanned whole. Decrementing the
/// callback's count per job (the flows' fan-in) updated its row 10,000
/// times in one transaction, each update walking the versions before it:
/// quadratic. (With batch_count applying each end at once, the batch's row
/// is updated 10,000 times and this fails; so it does with end_batch_edge
/// lowering the callback's parents_open per job.)
#[tokio::test]
async fn ten_thousand_jobs_end_in_one_transaction_with_one_update_of_the_batch() {
    const N: i64 = 10_000;
    let db = migrated_db().await;
    let mut c = db.client().await;
    let b = open(&c).await;
    let work = async |tx: &tokio_postgres::Transaction<'_>| -> (i64, i64, i64, i64) {
        let r = tx
            .query_one(
                "SELECT coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'batches'), 0)::int8,
                        coalesce(sum(n_tup_upd) FILTER (WHERE relname = 'jobs'), 0)::int8,
                        coalesce(sum(seq_scan) FILTER (WHERE relname = 'jobs'), 0)::int8,
                        coalesce(sum(seq_scan) FILTER (WHERE relname = 'job_parents'), 0)::int8
                 FROM pg_stat_xact_user_tables WHERE schemaname = 'pgwake'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1), r.get(2), r.get(3))
    };
    let tx = c.transaction().await.unwrap();
    let before = work(&tx).await;
    let ids: Vec<i64> = tx
        .query(
            "SELECT pgwake.enqueue('t', '{}', batch => $1) FROM generate_series(1, $2::int8)",
            &[&b, &N],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The check a commit runs, run now to be counted.
    tx.batch_execute("SET CONSTRAINTS pgwake.batch_checks_apply IMMEDIATE")
        .await
        .unwrap();
    let after = work(&tx).await;
    tx.commit().await.unwrap();
    // The adds' UPDATEs of jobs set has_children on each new job (N).
    assert_eq!(
        (after.0 - before.0, after.2 - before.2, after.3 - before.3),
        (1, 0, 0),
        "updates of the batch, scans of jobs and job_parents while adding {N} jobs"
    );
    batch_close(&c, b).await.unwrap();

    let tx = c.transaction().await.unwrap();
    // The jobs end as done ones do (removed); their triggers wait for the
    // commit. (This DELETE itself may scan jobs: counted from after it.)
    tx.execute("DELETE FROM pgwake.jobs WHERE id = ANY($1)", &[&ids])
        .await
        .unwrap();
    let before = work(&tx).await;
    // What a commit runs, in its order (the parents' ends, then the
    // batch's check they queued), run now to be counted.
    tx.batch_execute("SET CONSTRAINTS pgwake.jobs_release_children IMMEDIATE")
        .await
        .unwrap();
    tx.batch_execute("SET CONSTRAINTS pgwake.batch_checks_apply IMMEDIATE")
        .await
        .unwrap();
    let after = work(&tx).await;
    let held: bool = tx
        .query_one("SELECT held FROM pgwake.jobs WHERE id = $1", &[&b])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    assert!(!held, "the callback released by the last end");
    assert_eq!(
        (
            after.0 - before.0,
            after.1 - before.1,
            after.2 - before.2,
            after.3 - before.3
        ),
        (2, 1, 0, 0),
        "updates of the batch and of jobs, scans of jobs and job_parents while {N} jobs end"
    );
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!((s.total, s.done, s.state.as_str()), (N, N, "released"));
}

/// One run: (job id, task, started, ended).
type Run = (i64, String, Instant, Instant);

#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

/// `ok` ends done, `fail` fails, `report` (the callback) reads its batch's
/// status and keeps it.
struct Recorder {
    runs: Runs,
    summaries: Arc<Mutex<Vec<BatchStatus>>>,
}

#[async_trait]
impl Handler for Recorder {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let started = Instant::now();
        tokio::time::sleep(Duration::from_millis(5)).await;
        if job.task == "report" {
            let s = ctx.batch_status().await?;
            self.summaries.lock().unwrap().push(s);
        }
        self.runs
            .0
            .lock()
            .unwrap()
            .push((job.id, job.task.clone(), started, Instant::now()));
        if job.task == "fail" {
            Err("this batch job fails".into())
        } else {
            Ok(Outcome::Done)
        }
    }
}

/// A batch of done, dead and cancelled jobs, added in three transactions
/// and drained by two workers: the callback runs exactly once, after every
/// job's handler ended, and reads the right summary. (Without the
/// release in batch_apply the callback never runs and the wait times out;
/// without end_batch_edge in settle_parent, the same.)
async fn callback_runs_once_after_every_outcome(lease: bool, history: bool) {
    let db = migrated_db().await;
    let mut c = db.client().await;
    if history {
        pgwake::admin::history::apply(
            &c,
            pgwake::config::KeepFinished::Keep(Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    }
    let b = open(&c).await;
    let mut ok = Vec::new();
    let mut fail = Vec::new();
    for _ in 0..3 {
        let tx = c.transaction().await.unwrap();
        let mut jobs: Vec<NewJob> = (0..10)
            .map(|_| NewJob::new("ok", serde_json::json!({})).batch(b))
            .collect();
        let mut f = NewJob::new("fail", serde_json::json!({})).batch(b);
        f.max_attempts = Some(1);
        jobs.push(f);
        let ids = pgwake::client::enqueue_many(&tx, &jobs).await.unwrap();
        tx.commit().await.unwrap();
        ok.extend_from_slice(&ids[..10]);
        fail.push(ids[10]);
    }
    let cancelled = ok.pop().unwrap();
    let r: String = c
        .query_one("SELECT pgwake.cancel($1)", &[&cancelled])
        .await
        .unwrap()
        .get(0);
    assert_eq!(r, "cancelled");
    assert!(batch_close(&c, b).await.unwrap());

    let runs = Runs::default();
    let summaries = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<Running> = (0..2)
        .map(|_| {
            let mut builder = Worker::builder(db.config()).config(WorkerConfig {
                lease_queues: if lease {
                    vec!["default".into()]
                } else {
                    vec![]
                },
                concurrency: 4,
                ..test_config()
            });
            for task in ["ok", "fail", "report"] {
                builder = builder.handler(
                    task,
                    Recorder {
                        runs: runs.clone(),
                        summaries: summaries.clone(),
                    },
                );
            }
            Running::start(builder.build().unwrap())
        })
        .collect();
    wait_for("the batch to drain", Duration::from_secs(60), async || {
        let left: i64 = db
            .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)")
            .await;
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} jobs left"))
        }
    })
    .await;
    for w in workers {
        w.shutdown().await;
    }
    let runs = runs.0.lock().unwrap().clone();
    let reports: Vec<&Run> = runs.iter().filter(|r| r.0 == b).collect();
    assert_eq!(reports.len(), 1, "the callback ran once: {runs:?}");
    let by_id: HashMap<i64, usize> = runs.iter().fold(HashMap::new(), |mut m, r| {
        *m.entry(r.0).or_default() += 1;
        m
    });
    for id in ok.iter().chain(&fail) {
        assert_eq!(by_id.get(id), Some(&1), "job {id} ran once");
    }
    assert_eq!(by_id.get(&cancelled), None, "the cancelled job never ran");
    let last_end = runs.iter().filter(|r| r.0 != b).map(|r| r.3).max().unwrap();
    assert!(
        reports[0].2 > last_end,
        "the callback started before the last job of its batch ended"
    );
    let s = summaries.lock().unwrap()[0].clone();
    let mut failed = fail.clone();
    failed.push(cancelled);
    failed.sort();
    assert_eq!(
        (
            s.total,
            s.done,
            s.dead,
            s.cancelled,
            s.pending,
            s.failed_ids.clone(),
            s.failed_ids_omitted
        ),
        (33, 29, 3, 1, 0, failed, 0),
        "{s:?}"
    );
    assert_eq!(s.state, "released");
    // After the callback ran, the status answers the same, history or not.
    let after = batch_status(&c, b).await.unwrap();
    assert_eq!(
        (
            after.callback.as_str(),
            after.total,
            after.done,
            after.dead,
            after.cancelled
        ),
        ("ended", 33, 29, 3, 1)
    );
    if history {
        let kept: i64 = db.scalar("SELECT count(*) FROM pgwake.finished_jobs").await;
        assert!(kept >= 30, "history is on: {kept} finished jobs kept");
    }
}

#[tokio::test]
async fn tx_mode_callback_runs_once_after_every_outcome() {
    callback_runs_once_after_every_outcome(false, false).await;
}

#[tokio::test]
async fn tx_mode_with_history_callback_runs_once_after_every_outcome() {
    callback_runs_once_after_every_outcome(false, true).await;
}

#[tokio::test]
async fn lease_mode_callback_runs_once_after_every_outcome() {
    callback_runs_once_after_every_outcome(true, false).await;
}

#[tokio::test]
async fn lease_mode_with_history_callback_runs_once_after_every_outcome() {
    callback_runs_once_after_every_outcome(true, true).await;
}

/// A batch whose `block` job's worker is killed (kill -9) while it runs:
/// another worker runs it again, and the callback runs once, after the last
/// run of every job of the batch ended. (With release_batch's release of
/// the callback removed, the drain times out.)
async fn a_batch_survives_a_killed_worker(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let c = db.client().await;
    c.batch_execute("ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz")
        .await
        .unwrap();
    let b: i64 = db.scalar("SELECT pgwake.batch_open('work')").await;
    let block: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('block', max_attempts => 5, batch => $1)",
            &[&b],
        )
        .await
        .unwrap()
        .get(0);
    add(&c, b, "work", 10).await;
    batch_close(&c, b).await.unwrap();
    let mut args = mode.to_vec();
    args.push("--record-end");
    let mut first = ChaosWorker::spawn(&db, &args);
    until_runs(&db, "block running", Duration::from_secs(30), |r| {
        r.iter().any(|x| x.0 == block)
    })
    .await;
    let second = ChaosWorker::spawn(&db, &args);
    first.kill9();
    until_drained(&db).await;
    assert!(second.terminate().await.success());
    let rows = c
        .query(
            "SELECT job_id, count(*), min(at), max(ended_at) FROM pgwake_runs GROUP BY job_id",
            &[],
        )
        .await
        .unwrap();
    let by: HashMap<i64, (i64, std::time::SystemTime, Option<std::time::SystemTime>)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3))))
        .collect();
    assert_eq!(by.len(), 12, "every job ran: {by:?}");
    assert_eq!(by[&block].0, 2, "block ran again after the kill: {by:?}");
    assert_eq!(by[&b].0, 1, "the callback ran once: {by:?}");
    let last_end = by
        .iter()
        .filter(|(id, _)| **id != b)
        .map(|(_, v)| v.2.unwrap())
        .max()
        .unwrap();
    assert!(
        by[&b].1 > last_end,
        "the callback started before its batch ended"
    );
    let s = batch_status(&c, b).await.unwrap();
    assert_eq!((s.total, s.done), (11, 11));
}

#[tokio::test]
async fn tx_mode_a_batch_survives_a_killed_worker() {
    a_batch_survives_a_killed_worker(&[]).await;
}

#[tokio::test]
async fn lease_mode_a_batch_survives_a_killed_worker() {
    a_batch_survives_a_killed_worker(&["--lease", "--lease-ms", "1500"]).await;
}

/// A shell producer's batch: `pgwake batch open`, `pgwake enqueue --batch`
/// (flags and NDJSON), `pgwake batch close`, `pgwake batch status [--json]`;
/// an unknown batch is a usage error (exit 2) naming it. (Without the
/// `--batch` flag's line in job_from_flags, the total is 2, not 3.)
#[tokio::test]
async fn the_command_line_opens_fills_closes_and_shows_a_batch() {
    let db = migrated_db().await;
    let url = Some(db.url.as_str());
    let out = run_pgwake(&["batch", "open", "--task", "report"], url);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let b = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let out = run_pgwake(&["enqueue", "--task", "t", "--batch", &b], url);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let lines =
        format!("{{\"task\": \"t\", \"batch\": {b}}}\n{{\"task\": \"t\", \"batch\": {b}}}\n");
    let out = run_pgwake_stdin(&["enqueue", "--ndjson"], url, &lines);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = run_pgwake(&["batch", "close", &b], url);
    assert!(out.status.success(), "{}", stderr_of(&out));
    let out = run_pgwake(&["batch", "status", &b], url);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(&format!("batch {b}: closed"))
            && text.contains("jobs: 3 total, 0 done, 0 dead, 0 cancelled, 3 pending")
            && text.contains(&format!("callback: job {b} (held)")),
        "{text}"
    );
    let out = run_pgwake(&["batch", "status", "--json", &b], url);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["total"].as_i64(), v["state"].as_str()),
        (Some(3), Some("closed"))
    );

    let out = run_pgwake(&["batch", "status", "999999"], url);
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("batch 999999 does not exist"),
        "{}",
        stderr_of(&out)
    );
    let out = run_pgwake(&["enqueue", "--task", "t", "--batch", "999999"], url);
    assert!(!out.status.success());
    assert!(
        stderr_of(&out).contains("batch 999999 does not exist"),
        "{}",
        stderr_of(&out)
    );
}

/// `pgwake explain` of a held callback says which batch it waits for, from
/// the batch's counts: open (how to close it, and when the rescuer will),
/// then closed (how many jobs are left). (Without the batch's block in
/// pgwake.explain, the detail is the flows' "waiting for 1 of 3 parents".)
#[tokio::test]
async fn explain_says_what_a_callback_waits_for() {
    let db = migrated_db().await;
    let c = db.client().await;
    let b = open(&c).await;
    let jobs = add(&c, b, "t", 3).await;
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&jobs[0]])
        .await
        .unwrap();
    let reasons = pgwake::admin::jobs::explain(&c, b).await.unwrap();
    assert_eq!(reasons[0].reason, "waiting_for_parents", "{reasons:?}");
    assert!(
        reasons[0].detail.starts_with(&format!(
            "the callback of batch {b}, which is open: 1 of its 3 jobs have ended; it runs once the batch is closed (pgwake batch close {b}; else by the rescuer at "
        )),
        "{reasons:?}"
    );
    batch_close(&c, b).await.unwrap();
    let reasons = pgwake::admin::jobs::explain(&c, b).await.unwrap();
    assert_eq!(
        reasons[0].detail,
        format!("the callback of batch {b}, closed: waiting for 2 of its 3 jobs; it is released in the commit that ends the last (pgwake batch status {b})")
    );
}

/// The races at a batch's end, in both orders: a close and the last job's
/// end committed at the same time release the callback once, whichever
/// commits first (the one that commits second waits on the batch's row
/// and then sees the other's commit); a job added by a transaction that
/// commits after the batch was closed is refused at its commit, and
/// nothing of it stays. (Without close_batch's release, the first order
/// leaves the callback held.)
#[tokio::test]
async fn a_close_and_the_last_end_at_once_release_the_callback() {
    let db = migrated_db().await;
    let waits = async || {
        wait_for("a session to wait for a lock", Duration::from_secs(10), async || {
            let waiting: i64 = db
                .scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()")
                .await;
            if waiting > 0 {
                Ok(())
            } else {
                Err("no session waits".to_string())
            }
        })
        .await
    };
    for close_first in [true, false] {
        let closer = db.client().await;
        let ender = db.client().await;
        let b = open(&closer).await;
        let jobs = add(&closer, b, "t", 1).await;
        closer.batch_execute("BEGIN").await.unwrap();
        ender.batch_execute("BEGIN").await.unwrap();
        ender
            .execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&jobs[0]])
            .await
            .unwrap();
        if close_first {
            // The close holds the batch's row; the end's commit waits for it.
            closer
                .execute("SELECT pgwake.batch_close($1)", &[&b])
                .await
                .unwrap();
            let end = tokio::spawn(async move { ender.batch_execute("COMMIT").await });
            waits().await;
            closer.batch_execute("COMMIT").await.unwrap();
            end.await.unwrap().unwrap();
        } else {
            // The end's check holds the batch's row; the close waits for it.
            ender
                .batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
                .await
                .unwrap();
            let close = tokio::spawn(async move {
                closer
                    .execute("SELECT pgwake.batch_close($1)", &[&b])
                    .await?;
                closer.batch_execute("COMMIT").await
            });
            waits().await;
            ender.batch_execute("COMMIT").await.unwrap();
            close.await.unwrap().unwrap();
        }
        assert!(!callback_held(&db, b).await, "close first: {close_first}");
        let s = batch_status(&db.client().await, b).await.unwrap();
        assert_eq!(
            (s.state.as_str(), s.done),
            ("released", 1),
            "close first: {close_first}"
        );
    }

    // An add that commits after the close.
    let mut adder = db.client().await;
    let closer = db.client().await;
    let b = open(&closer).await;
    let ta = adder.transaction().await.unwrap();
    ta.execute("SELECT pgwake.enqueue('t', batch => $1)", &[&b])
        .await
        .unwrap();
    batch_close(&closer, b).await.unwrap();
    let e = ta.commit().await.unwrap_err();
    let msg = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(
        msg.contains(&format!("batch {b} was closed")) && msg.contains("its 1 jobs were not added"),
        "{e:?}"
    );
    let s = batch_status(&closer, b).await.unwrap();
    assert_eq!((s.total, s.state.as_str()), (0, "released"));
}

/// A batch nobody closes is closed by the rescuer's sweep once its
/// close_by has passed (here: moved into the past), and its callback
/// released; a batch whose callback has left the queue is forgotten by
/// the sweep. (Without the sweep's close, the callback stays held.)
#[tokio::test]
async fn the_rescuer_closes_a_batch_left_open_and_forgets_a_finished_one() {
    let db = migrated_db().await;
    let c = db.client().await;
    let b = open(&c).await;
    let jobs = add(&c, b, "t", 2).await;
    c.execute("DELETE FROM pgwake.jobs WHERE id = ANY($1)", &[&jobs])
        .await
        .unwrap();
    c.execute("SELECT pgwake.release_stalled_flows(NULL, 100)", &[])
        .await
        .unwrap();
    assert!(callback_held(&db, b).await, "not before its close_by");
    c.execute(
        "UPDATE pgwake.batches SET close_by = now() - interval '1 second' WHERE id = $1",
        &[&b],
    )
    .await
    .unwrap();
    c.execute("SELECT pgwake.release_stalled_flows(NULL, 100)", &[])
        .await
        .unwrap();
    assert!(
        !callback_held(&db, b).await,
        "closed and released by the sweep"
    );
    let v: serde_json::Value = db.scalar(&format!("SELECT pgwake.batch_status({b})")).await;
    assert_eq!(
        (
            v["state"].as_str(),
            v["closed_by"].as_str(),
            v["done"].as_i64()
        ),
        (Some("released"), Some("timeout"), Some(2)),
        "{v}"
    );
    // The callback runs (removed, as a done job without history is): the
    // status answers for a day after the release, then the batch goes.
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&b])
        .await
        .unwrap();
    c.execute("SELECT pgwake.release_stalled_flows(NULL, 100)", &[])
        .await
        .unwrap();
    assert_eq!(batch_status(&c, b).await.unwrap().callback, "ended");
    c.execute(
        "UPDATE pgwake.batches SET released_at = now() - interval '25 hours' WHERE id = $1",
        &[&b],
    )
    .await
    .unwrap();
    c.execute("SELECT pgwake.release_stalled_flows(NULL, 100)", &[])
        .await
        .unwrap();
    let e = batch_status(&c, b).await.unwrap_err().to_string();
    assert!(e.contains(&format!("batch {b} does not exist")), "{e}");
}

/// A producer role (pgwake.grant_producer) opens a batch, adds to it,
/// closes it and reads its status; a worker's end of its jobs releases
/// the callback (the check runs as the schema's owner). (Without the
/// grant of the batch functions, the open is refused.)
#[tokio::test]
async fn a_producer_role_runs_a_batch() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(&format!(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bf_producer') THEN
                 CREATE ROLE bf_producer LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
             END IF;
         END $$;
         GRANT CONNECT ON DATABASE {} TO bf_producer;
         SELECT pgwake.grant_producer('bf_producer');",
        db.name
    ))
    .await
    .unwrap();
    let mut cfg = db.config();
    cfg.user("bf_producer");
    cfg.password("pw");
    let producer = pgwake::connect::connect(&cfg).await.unwrap();
    let b = open(&producer).await;
    let ids = pgwake::client::enqueue_many(
        &producer,
        &[
            NewJob::new("t", serde_json::json!({})).batch(b),
            NewJob::new("t", serde_json::json!({})).batch(b),
        ],
    )
    .await
    .unwrap();
    let one: i64 = producer
        .query_one("SELECT pgwake.enqueue('t', batch => $1)", &[&b])
        .await
        .unwrap()
        .get(0);
    assert!(batch_close(&producer, b).await.unwrap());
    assert_eq!(batch_status(&producer, b).await.unwrap().total, 3);
    c.execute(
        "DELETE FROM pgwake.jobs WHERE id = ANY($1)",
        &[&[ids[0], ids[1], one].as_slice()],
    )
    .await
    .unwrap();
    assert!(!callback_held(&db, b).await);
}

/// One transaction that ends the jobs of two batches counts both (the
/// first check of its commit applies every batch it touched, in id order)
/// and releases both callbacks. (Not shown failing: it pins the outcome
/// of the id-ordered apply; the deadlock that order prevents needs two
/// commits interleaved inside their deferred triggers, which a test
/// cannot force.)
#[tokio::test]
async fn one_commit_ending_jobs_of_two_batches_releases_both() {
    let db = migrated_db().await;
    let mut c = db.client().await;
    let a = open(&c).await;
    let b = open(&c).await;
    let mut jobs = add(&c, b, "t", 3).await;
    jobs.extend(add(&c, a, "t", 2).await);
    batch_close(&c, a).await.unwrap();
    batch_close(&c, b).await.unwrap();
    let tx = c.transaction().await.unwrap();
    for id in jobs.iter().rev() {
        tx.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[id])
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    assert!(!callback_held(&db, a).await && !callback_held(&db, b).await);
    let (sa, sb) = (
        batch_status(&c, a).await.unwrap(),
        batch_status(&c, b).await.unwrap(),
    );
    assert_eq!((sa.done, sb.done), (2, 3));
}
