//! Progress in both delivery modes: what a running job reports is shown by
//! `pgwake job show` and `pgwake explain` while it runs, a thousand reports
//! are a handful of writes, a report over a bound is an `Err` that changes
//! nothing, the row goes when the run ends; writes are fenced by the run
//! (a stale run never overwrites a newer run's progress, and readers never
//! show a run that is over), and a run killed with `kill -9` leaves no
//! progress shown for the run after it.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::admin::jobs;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Job, JobContext, Outcome, Worker, WorkerConfig};
use serde_json::json;

const LEASE: &[&str] = &["--lease", "--lease-ms", "1500"];

/// Reports `{"i": 0}` … `{"i": 999}` as fast as it can, then one value
/// over the bound (whose error it records), then waits for the test.
struct Reporting {
    release: Arc<tokio::sync::Semaphore>,
    refused: Arc<std::sync::Mutex<Option<String>>>,
}

#[async_trait]
impl pgwake::Handler for Reporting {
    async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        for i in 0..1000 {
            ctx.progress(&json!({"i": i, "of": 1000}), Some(&format!("row {i}")))?;
        }
        let big = json!({"blob": "x".repeat(pgwake::PROGRESS_VALUE_MAX)});
        *self.refused.lock().unwrap() = ctx.progress(&big, None).err().map(|e| e.to_string());
        self.release.acquire().await?.forget();
        Ok(Outcome::Done)
    }
}

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        progress_interval: Duration::from_millis(50),
        ..test_config()
    }
}

/// Statements that wrote `pgwake.job_progress`, counted by a statement
/// trigger in `progress_statements` (an `INSERT … ON CONFLICT DO UPDATE`
/// fires both its INSERT and its UPDATE triggers: two a flush).
async fn count_progress_statements(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE progress_statements (n bigint NOT NULL);
             INSERT INTO progress_statements VALUES (0);
             CREATE FUNCTION count_progress() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN UPDATE progress_statements SET n = n + 1; RETURN NULL; END $$;
             CREATE TRIGGER count_progress AFTER INSERT OR UPDATE ON pgwake.job_progress
                 FOR EACH STATEMENT EXECUTE FUNCTION count_progress();",
        )
        .await
        .unwrap();
}

/// A job reports a thousand times in a tight loop: job show and explain
/// show its last report while it runs, written by a handful of statements
/// (with a statement per report the trigger counts 2000); a value over the bound is refused and
/// the last accepted one stays; once the job is done, its row is gone.
async fn progress_is_shown_while_it_runs_coalesced_and_gone_after(lease: bool) {
    let db = migrated_db().await;
    count_progress_statements(&db).await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("report", json!({})))
        .await
        .unwrap();
    let release = Arc::new(tokio::sync::Semaphore::new(0));
    let refused = Arc::new(std::sync::Mutex::new(None));
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "report",
            Reporting {
                release: release.clone(),
                refused: refused.clone(),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let shown = wait_for(
        "job show to show the last report",
        Duration::from_secs(30),
        async || {
            let d = jobs::show(&client, id).await.unwrap().unwrap();
            match d.progress {
                Some(p) if p.value == r#"{"i": 999, "of": 1000}"# => Ok(p),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    assert_eq!(shown.message.as_deref(), Some("row 999"));
    let refused = refused
        .lock()
        .unwrap()
        .clone()
        .expect("the big value refused");
    assert!(refused.contains("PROGRESS_VALUE_MAX"), "{refused}");
    let reasons = jobs::explain(&client, id).await.unwrap();
    assert_eq!(reasons[0].reason, "running", "{reasons:?}");
    let progress = reasons
        .iter()
        .find(|r| r.reason == "progress")
        .unwrap_or_else(|| panic!("no progress reason: {reasons:?}"));
    assert!(
        progress.detail.contains(r#"{"i": 999, "of": 1000}"#)
            && progress.detail.contains("row 999"),
        "{progress:?}"
    );
    // The commands say it too.
    let show = run_pgwake(&["job", "show", &id.to_string()], Some(&db.url));
    let show = String::from_utf8_lossy(&show.stdout);
    assert!(
        show.contains(r#"  progress   {"i": 999, "of": 1000} row 999 (at "#),
        "{show}"
    );
    let explain = run_pgwake(&["explain", &id.to_string()], Some(&db.url));
    let explain = String::from_utf8_lossy(&explain.stdout);
    assert!(
        explain.contains(r#"progress: its handler reported {"i": 999, "of": 1000} (row 999) at "#),
        "{explain}"
    );
    let statements: i64 = db.scalar("SELECT n FROM progress_statements").await;
    assert!(
        (1..=5).contains(&statements),
        "1000 reports written by {statements} statements"
    );
    release.add_permits(1);
    w.next_events(1, Duration::from_secs(30), |e| e.id == id)
        .await;
    until_progress_row_gone(&db, id, "the run's row to go").await;
    w.shutdown().await;
}

#[tokio::test]
async fn tx_mode_progress_is_shown_while_it_runs_coalesced_and_gone_after() {
    progress_is_shown_while_it_runs_coalesced_and_gone_after(false).await;
}

#[tokio::test]
async fn lease_mode_progress_is_shown_while_it_runs_coalesced_and_gone_after() {
    progress_is_shown_while_it_runs_coalesced_and_gone_after(true).await;
}

const FLUSH: &str = include_str!("../../src/db/sql/progress_flush.sql");

/// Write progress as the worker's flush does, for one job and run:
/// whether the row was written.
async fn flush(
    c: &tokio_postgres::Client,
    job: i64,
    token: Option<i64>,
    xid: Option<&str>,
    value: &str,
) -> bool {
    let xid = xid.map(str::to_string);
    !c.query(
        FLUSH,
        &[
            &vec![job],
            &vec![token],
            &vec![xid],
            &vec![value],
            &vec![None::<String>],
        ],
    )
    .await
    .unwrap()
    .is_empty()
}

async fn shown(c: &tokio_postgres::Client, job: i64) -> Option<String> {
    jobs::progress(c, &[job])
        .await
        .unwrap()
        .remove(&job)
        .map(|p| p.value)
}

/// Lease mode: a token that does not hold the lease writes nothing; the
/// lease's token does; once the lease is lost (its token gone), readers
/// show nothing, and a later run's write replaces the stale row, which a
/// stale token never can. With the fence off (every row written and
/// shown) the stale token's write lands and the lost run stays shown.
#[tokio::test]
async fn lease_progress_is_fenced_by_the_claim_token() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id = enqueue(&c, &NewJob::new("t", json!({}))).await.unwrap();
    let rows = claim_lease_all(&c, "w1").await;
    let token: i64 = rows[0].get(12);
    assert!(!flush(&c, id, Some(token + 1000), None, r#"{"n": 0}"#).await);
    assert!(flush(&c, id, Some(token), None, r#"{"n": 1}"#).await);
    assert_eq!(shown(&c, id).await.as_deref(), Some(r#"{"n": 1}"#));
    // The lease is lost: its run is over, whatever its row says.
    c.execute(
        "UPDATE pgwake.leased_jobs SET token = token + 1 WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
    assert_eq!(
        shown(&c, id).await,
        None,
        "a lost run's progress is not shown"
    );
    assert!(!flush(&c, id, Some(token), None, r#"{"n": 2}"#).await);
    assert!(flush(&c, id, Some(token + 1), None, r#"{"n": 3}"#).await);
    assert!(!flush(&c, id, Some(token), None, r#"{"n": 4}"#).await);
    assert_eq!(shown(&c, id).await.as_deref(), Some(r#"{"n": 3}"#));
}

/// Tx mode: a run writes while its claim transaction is open; once it
/// ends, its row is not shown and the next run's write replaces it; the
/// old run cannot write any more.
#[tokio::test]
async fn tx_progress_is_fenced_by_the_claim_transaction() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id = enqueue(&c, &NewJob::new("t", json!({}))).await.unwrap();
    let claimer = db.client().await;
    claimer.batch_execute("BEGIN").await.unwrap();
    let rows = claim_tx_all(&claimer).await;
    assert_eq!(rows.len(), 1);
    let xid: String = rows[0].get(12);
    assert!(flush(&c, id, None, Some(&xid), r#"{"n": 1}"#).await);
    assert_eq!(shown(&c, id).await.as_deref(), Some(r#"{"n": 1}"#));
    // The claim ends without an outcome (a crash): the job is back.
    claimer.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        shown(&c, id).await,
        None,
        "an ended run's progress is not shown"
    );
    assert!(!flush(&c, id, None, Some(&xid), r#"{"n": 2}"#).await);
    claimer.batch_execute("BEGIN").await.unwrap();
    let rows = claim_tx_all(&claimer).await;
    let xid2: String = rows[0].get(12);
    assert!(flush(&c, id, None, Some(&xid2), r#"{"n": 3}"#).await);
    assert_eq!(shown(&c, id).await.as_deref(), Some(r#"{"n": 3}"#));
    claimer.batch_execute("ROLLBACK").await.unwrap();
}

/// A run reports its progress and its worker is killed with `kill -9`;
/// another worker runs the job again (reporting nothing): while it runs,
/// neither job show nor explain shows the dead run's progress, and the
/// rescuer's round deletes the dead run's row. With readers that do not
/// check the run (and no sweep), the dead run's `{"attempt": 1, …}` is
/// shown as the new run's progress.
async fn a_killed_runs_progress_is_not_shown_for_the_next_run(mode: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("progress", json!({})))
        .await
        .unwrap();
    let gate = Gate::closed(&db).await;
    let mut a = ChaosWorker::spawn(&db, mode);
    wait_for(
        "the first run's progress",
        Duration::from_secs(60),
        async || match jobs::show(&client, id).await.unwrap().unwrap().progress {
            Some(p) if p.value.contains(r#""attempt": 1"#) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    let b = ChaosWorker::spawn(&db, mode);
    a.kill9();
    until_runs(&db, "a second run", Duration::from_secs(60), |r| {
        r.len() >= 2
    })
    .await;
    let reasons = jobs::explain(&client, id).await.unwrap();
    assert_eq!(reasons[0].reason, "running", "{reasons:?}");
    assert!(
        !reasons.iter().any(|r| r.reason == "progress"),
        "{reasons:?}"
    );
    let d = jobs::show(&client, id).await.unwrap().unwrap();
    assert_eq!(d.progress, None, "the dead run's progress shown as current");
    until_progress_row_gone(&db, id, "the dead run's row to go").await;
    gate.open().await;
    until_drained(&db).await;
    assert!(b.terminate().await.success());
    let runs = ledger_runs(&db).await;
    assert!(runs.iter().all(|r| !r.3), "a run overlapped: {runs:?}");
}

#[tokio::test]
async fn tx_mode_a_killed_runs_progress_is_not_shown_for_the_next_run() {
    a_killed_runs_progress_is_not_shown_for_the_next_run(&[]).await;
}

#[tokio::test]
async fn lease_mode_a_killed_runs_progress_is_not_shown_for_the_next_run() {
    a_killed_runs_progress_is_not_shown_for_the_next_run(LEASE).await;
}

/// An `exec` command's `pgwake-progress:` stderr lines: the first (a value
/// and a message) is shown while the command runs; a line that is not
/// JSON and one over the value's bound are refused and change nothing;
/// the command goes on and its job is done, its row gone. With the line
/// not parsed (taken for an ordinary stderr line) nothing is shown.
async fn an_exec_commands_progress_line_is_shown_while_it_runs(tx: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("report.sh");
    let go = dir.path().join("go");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             echo 'pgwake-progress: {{\"done\": 2, \"of\": 3}} two of three' >&2\n\
             echo 'pgwake-progress: {{oops' >&2\n\
             printf 'pgwake-progress: \"%s\"\\n' \"$(head -c 5000 /dev/zero | tr '\\0' x)\" >&2\n\
             while [ ! -e {} ]; do sleep 0.05; done\n",
            go.display()
        ),
    )
    .unwrap();
    let id = enqueue(&client, &NewJob::new("report", json!({})))
        .await
        .unwrap();
    let (task, h) =
        pgwake::handlers::parse_flag(&format!("report=exec:sh {}", script.display())).unwrap();
    let h = if tx {
        pgwake::handlers::with_delivery(h, pgwake::Delivery::Tx)
    } else {
        h
    };
    let worker = Worker::builder(db.config())
        .config(config(false))
        .handler_arc(&task, h)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let p = wait_for(
        "the command's progress",
        Duration::from_secs(30),
        async || match jobs::show(&client, id).await.unwrap().unwrap().progress {
            Some(p) => Ok(p),
            None => Err("none".into()),
        },
    )
    .await;
    assert_eq!(
        (p.value.as_str(), p.message.as_deref()),
        (r#"{"of": 3, "done": 2}"#, Some("two of three"))
    );
    std::fs::write(&go, "").unwrap();
    let ev = w
        .next_events(1, Duration::from_secs(30), |e| e.id == id)
        .await;
    assert_eq!(ev[0].outcome(), "done", "{ev:?}");
    until_progress_row_gone(&db, id, "the run's row to go").await;
    w.shutdown().await;
}

#[tokio::test]
async fn tx_mode_an_exec_commands_progress_line_is_shown_while_it_runs() {
    an_exec_commands_progress_line_is_shown_while_it_runs(true).await;
}

#[tokio::test]
async fn lease_mode_an_exec_commands_progress_line_is_shown_while_it_runs() {
    an_exec_commands_progress_line_is_shown_while_it_runs(false).await;
}

/// Wait until job `id` has no row in `pgwake.job_progress` (its run ended,
/// or the rescuer swept a dead run's).
async fn until_progress_row_gone(db: &TestDb, id: i64, what: &str) {
    wait_for(what, Duration::from_secs(30), async || {
        let left: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.job_progress WHERE job_id = {id}"
            ))
            .await;
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} row(s)"))
        }
    })
    .await;
}
