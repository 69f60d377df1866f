//! Durable steps in both delivery modes (`JobContext::step`): a recorded
//! step never runs again — across a failed attempt and its retry, a worker
//! killed with `kill -9` between steps and inside one, a lost lease — as a
//! ledger written by each step's body proves; a name twice in one run, a
//! bad name and an output over the bound are refused and record nothing;
//! steps stay while the job exists and go with it.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::admin::jobs;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Job, JobContext, Outcome, StepError, Worker, WorkerConfig};
use serde_json::json;

const LEASE: &[&str] = &["--lease", "--lease-ms", "1500"];

/// The step ledger the chaos worker's `steps` task writes (through the
/// claim transaction in tx mode), and the table where it says that run 2
/// is about to block (on its own connection, so visible at once).
async fn create_step_ledger(db: &TestDb) {
    create_run_ledger(db).await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE pgwake_step_ledger (job_id bigint NOT NULL, step text NOT NULL, run bigint NOT NULL,
                                              at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE pgwake_step_blocked (job_id bigint NOT NULL, at text NOT NULL);",
        )
        .await
        .unwrap();
}

/// (step, run) of every execution of a step's body that committed, in order.
async fn step_ledger(db: &TestDb) -> Vec<(String, i64)> {
    db.client()
        .await
        .query(
            "SELECT step, run FROM pgwake_step_ledger ORDER BY at, step",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

/// Run 1 of a `steps` job runs s1 and fails; run 2 blocks where `payload`
/// says (inside or after a step) and its worker is killed with `kill -9`;
/// a second worker runs it to the end. Returns the step ledger.
async fn killed_run(mode: &[&str], payload: serde_json::Value) -> Vec<(String, i64)> {
    let db = migrated_db().await;
    create_step_ledger(&db).await;
    let client = db.client().await;
    enqueue(&client, &NewJob::new("steps", payload))
        .await
        .unwrap();
    let mut a = ChaosWorker::spawn(&db, mode);
    wait_for("run 2 to block", Duration::from_secs(60), async || {
        let blocked: i64 = db.scalar("SELECT count(*) FROM pgwake_step_blocked").await;
        if blocked > 0 {
            Ok(())
        } else {
            Err(format!("runs so far: {:?}", ledger_runs(&db).await))
        }
    })
    .await;
    let b = ChaosWorker::spawn(&db, mode);
    a.kill9();
    until_drained(&db).await;
    assert!(b.terminate().await.success());
    let runs = ledger_runs(&db).await;
    assert!(runs.iter().all(|r| !r.3), "a run overlapped: {runs:?}");
    step_ledger(&db).await
}

fn ledger(steps: &[(&str, i64)]) -> Vec<(String, i64)> {
    steps.iter().map(|(s, r)| (s.to_string(), *r)).collect()
}

/// Run 1 records s1 and fails; run 2 is killed with `kill -9` inside s3:
/// s1 never runs again in either mode (with recorded steps run again, or
/// with a tx-mode failure rolled back to before its steps, the ledger shows
/// s1 in a later run). Lease mode: s2, recorded before the kill, does not
/// run again; s3, killed before it was recorded, does (its body's ledger
/// row is on its own connection). Tx mode: the kill rolls back run 2's
/// claim transaction, its step records and its ledger rows with it.
#[tokio::test]
async fn tx_mode_no_recorded_step_runs_again_after_a_failed_attempt_and_a_kill_inside_a_step() {
    let ran = killed_run(&[], json!({"fail_after": "s1", "block_in": "s3"})).await;
    assert_eq!(ran, ledger(&[("s1", 1), ("s2", 3), ("s3", 3)]));
}

#[tokio::test]
async fn lease_mode_no_recorded_step_runs_again_after_a_failed_attempt_and_a_kill_inside_a_step() {
    let ran = killed_run(LEASE, json!({"fail_after": "s1", "block_in": "s3"})).await;
    assert_eq!(ran, ledger(&[("s1", 1), ("s2", 2), ("s3", 2), ("s3", 3)]));
}

/// The same, killed between s2 and s3: lease mode resumes at s3.
#[tokio::test]
async fn tx_mode_no_recorded_step_runs_again_after_a_kill_between_steps() {
    let ran = killed_run(&[], json!({"fail_after": "s1", "block_after": "s2"})).await;
    assert_eq!(ran, ledger(&[("s1", 1), ("s2", 3), ("s3", 3)]));
}

#[tokio::test]
async fn lease_mode_no_recorded_step_runs_again_after_a_kill_between_steps() {
    let ran = killed_run(LEASE, json!({"fail_after": "s1", "block_after": "s2"})).await;
    assert_eq!(ran, ledger(&[("s1", 1), ("s2", 2), ("s3", 3)]));
}

/// What the in-process handlers below saw: (attempt, step) of each step
/// body that ran, and each refusal's message.
#[derive(Default, Clone)]
struct Seen {
    ran: Arc<Mutex<Vec<(i32, String)>>>,
    refused: Arc<Mutex<Vec<String>>>,
}

impl Seen {
    fn ran(&self, attempt: i32, step: &str) {
        self.ran.lock().unwrap().push((attempt, step.to_string()));
    }
    fn refused(&self, e: StepError) {
        self.refused.lock().unwrap().push(e.to_string());
    }
}

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        lease_duration: Duration::from_millis(1500),
        rescue_interval: Duration::from_millis(200),
        ..test_config()
    }
}

/// Calls step `a` twice, then a step with a bad name, then one whose
/// output is over the bound: each refusal is recorded; then `b`.
struct Refusals(Seen);

#[async_trait]
impl pgwake::Handler for Refusals {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let seen = &self.0;
        let a: i64 = ctx
            .step("a", async {
                seen.ran(job.attempt, "a");
                Ok::<_, BoxError>(1)
            })
            .await?;
        match ctx
            .step("a", async {
                seen.ran(job.attempt, "a again");
                Ok::<_, BoxError>(2)
            })
            .await
        {
            Err(e @ StepError::Duplicate(_)) => seen.refused(e),
            other => panic!("a second 'a' gave {other:?}"),
        }
        for bad in ["", "a b", "<script>", "\u{1b}[2J"] {
            match ctx.step(bad, async { Ok::<_, BoxError>(0) }).await {
                Err(e @ StepError::BadName { .. }) => seen.refused(e),
                other => panic!("name {bad:?} gave {other:?}"),
            }
        }
        let big = "x".repeat(pgwake::STEP_OUTPUT_MAX);
        match ctx.step("big", async { Ok::<_, BoxError>(big) }).await {
            Err(e @ StepError::TooLarge { .. }) => seen.refused(e),
            other => panic!("an output over the bound gave {other:?}"),
        }
        match ctx
            .step("failing", async { Err::<i64, _>("it failed") })
            .await
        {
            Err(e @ StepError::Failed { .. }) => seen.refused(e),
            other => panic!("a failed step gave {other:?}"),
        }
        let b: i64 = ctx
            .step("b", async {
                seen.ran(job.attempt, "b");
                Ok::<_, BoxError>(a + 1)
            })
            .await?;
        assert_eq!(b, 2);
        // Stays to be looked at: the test cancels it.
        std::future::pending::<()>().await;
        Ok(Outcome::Done)
    }
}

/// A name twice in one run, bad names, an output over the bound and a
/// failed step are refused with the bound or the fix named, and record
/// nothing: only `a` (its first output) and `b` are recorded, shown by job
/// show.
async fn duplicates_bad_names_and_big_outputs_are_refused(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("refusals", json!({})))
        .await
        .unwrap();
    let seen = Seen::default();
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler("refusals", Refusals(seen.clone()))
        .build()
        .unwrap();
    let w = Running::start(worker);
    // Tx mode: the steps show once the claim transaction commits; wait for
    // the handler to reach its end, then cancel the job (a cancel keeps
    // the finished steps, as a failure does).
    wait_for("both steps", Duration::from_secs(30), async || {
        let ran = seen.ran.lock().unwrap().clone();
        if ran.len() >= 2 {
            Ok(ran)
        } else {
            Err(format!("{ran:?}"))
        }
    })
    .await;
    pgwake::cancel(&client, id).await.unwrap();
    let steps = wait_for("the steps recorded", Duration::from_secs(30), async || {
        let d = jobs::show(&client, id).await.unwrap().unwrap();
        if d.steps.len() == 2 {
            Ok(d.steps)
        } else {
            Err(format!("{:?}", d.steps))
        }
    })
    .await;
    w.shutdown().await;
    let names: Vec<(&str, &str)> = steps
        .iter()
        .map(|s| (s.name.as_str(), s.output.as_str()))
        .collect();
    assert_eq!(names, vec![("a", "1"), ("b", "2")]);
    assert_eq!(
        *seen.ran.lock().unwrap(),
        vec![(1, "a".to_string()), (1, "b".to_string())]
    );
    let refused = seen.refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 7, "{refused:?}");
    assert!(
        refused[0].contains("called twice in one run"),
        "{refused:?}"
    );
    assert!(refused[1].contains("STEP_NAME_MAX"), "{refused:?}");
    assert!(!refused[4].contains('\u{1b}'), "{refused:?}");
    assert!(refused[5].contains("STEP_OUTPUT_MAX"), "{refused:?}");
    assert!(refused[6].contains("it failed"), "{refused:?}");
}

#[tokio::test]
async fn tx_mode_duplicates_bad_names_and_big_outputs_are_refused() {
    duplicates_bad_names_and_big_outputs_are_refused(false).await;
}

#[tokio::test]
async fn lease_mode_duplicates_bad_names_and_big_outputs_are_refused() {
    duplicates_bad_names_and_big_outputs_are_refused(true).await;
}

/// Attempt 1 records `a`, then loses its lease inside `b` (the test's
/// stand-in for a rescue and another worker's claim: the lease's token
/// changes): `b` ran but is refused, `StepError::LostLease`. Attempt 2
/// (after the lease expired and the rescuer put the job back) skips `a`
/// and runs and records `b`.
struct LosesLease(Seen);

#[async_trait]
impl pgwake::Handler for LosesLease {
    fn delivery(&self) -> pgwake::Delivery {
        pgwake::Delivery::Lease
    }

    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let seen = &self.0;
        ctx.step("a", async {
            seen.ran(job.attempt, "a");
            Ok::<_, BoxError>(job.attempt)
        })
        .await?;
        let b = ctx
            .step("b", async {
                seen.ran(job.attempt, "b");
                if job.attempt == 1 {
                    ctx.pool()
                        .get()
                        .await?
                        .execute(
                            "UPDATE pgwake.leased_jobs SET token = token + 1 WHERE id = $1",
                            &[&job.id],
                        )
                        .await?;
                }
                Ok::<_, BoxError>(job.attempt)
            })
            .await;
        match b {
            Err(e @ StepError::LostLease(_)) => {
                seen.refused(e);
                Err("lost the lease".into())
            }
            Err(e) => Err(e.into()),
            Ok(_) => Ok(Outcome::Done),
        }
    }
}

#[tokio::test]
async fn lease_mode_a_run_that_lost_its_lease_records_no_step() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("loses", json!({})))
        .await
        .unwrap();
    let seen = Seen::default();
    let worker = Worker::builder(db.config())
        .config(config(true))
        .handler("loses", LosesLease(seen.clone()))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.next_events(1, Duration::from_secs(60), |e| {
        e.outcome() == "done" && e.id == id
    })
    .await;
    let steps = jobs::show(&client, id).await.unwrap().unwrap().steps;
    w.shutdown().await;
    assert_eq!(
        *seen.ran.lock().unwrap(),
        vec![
            (1, "a".to_string()),
            (1, "b".to_string()),
            (2, "b".to_string())
        ],
        "a ran once; b twice, recorded only by attempt 2"
    );
    let refused = seen.refused.lock().unwrap().clone();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].contains("lost the job's lease"), "{refused:?}");
    let recorded: Vec<(&str, i32)> = steps.iter().map(|s| (s.name.as_str(), s.attempt)).collect();
    assert!(
        recorded.is_empty() || recorded == vec![("a", 1), ("b", 2)],
        "{recorded:?}"
    );
}

/// A job's steps stay while it is dead (a `pgwake dead retry` resumes it)
/// and go with it: the history maintenance's sweep deletes the steps of a
/// job that is gone, and of no job that exists.
#[tokio::test]
async fn steps_stay_with_a_dead_job_and_go_when_it_is_gone() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id = enqueue(&c, &NewJob::new("t", json!({}))).await.unwrap();
    c.batch_execute(&format!(
        "INSERT INTO pgwake.job_steps (job_id, name, output, attempt)
         VALUES ({id}, 'a', '1', 1), (-7, 'a', '2', 1), (-7, 'b', '3', 1)"
    ))
    .await
    .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let maintenance =
        pgwake::internal::Maintenance::new(pool, pgwake::config::HistoryConfig::default());
    let report = maintenance.run_once().await.unwrap();
    assert_eq!(report.steps_swept, 2, "{report:?}");
    assert_eq!(jobs::steps(&c, id).await.unwrap().len(), 1);
    // Dead: kept (a `pgwake dead retry` resumes after its steps).
    c.execute(
        "WITH j AS (DELETE FROM pgwake.jobs WHERE id = $1 RETURNING *)
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                                       max_attempts, last_error, created_at)
         SELECT id, queue, task, payload, priority, run_at, 1, 1, 'failed', created_at FROM j",
        &[&id],
    )
    .await
    .unwrap();
    let report = maintenance.run_once().await.unwrap();
    assert_eq!(report.steps_swept, 0, "{report:?}");
    assert_eq!(jobs::steps(&c, id).await.unwrap().len(), 1);
    c.execute("DELETE FROM pgwake.dead_jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    let report = maintenance.run_once().await.unwrap();
    assert_eq!(report.steps_swept, 1, "{report:?}");
    assert!(jobs::steps(&c, id).await.unwrap().is_empty());
}

const RECORD_LEASE: &str = include_str!("../../src/db/sql/step_record_lease.sql");

/// Lease mode at the statement: a token that does not hold the job's lease
/// records nothing; the lease's token does, once per name. With the fence
/// off the stale token's step lands.
#[tokio::test]
async fn lease_steps_are_fenced_by_the_claim_token() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id = enqueue(&c, &NewJob::new("t", json!({}))).await.unwrap();
    let rows = claim_lease_all(&c, "w1").await;
    let token: i64 = rows[0].get(12);
    let record = async |name: &str, token: i64| {
        !c.query(RECORD_LEASE, &[&id, &name, &"1", &1i32, &token])
            .await
            .unwrap()
            .is_empty()
    };
    assert!(!record("a", token + 1000).await, "a stale token records");
    assert!(record("a", token).await);
    assert!(!record("a", token).await, "a name recorded twice");
    assert_eq!(jobs::steps(&c, id).await.unwrap().len(), 1);
}

/// `pgwake job show` lists a job's steps: name, attempt, output cut to 200
/// characters, control characters and bidi controls in an output escaped.
#[tokio::test]
async fn job_show_lists_the_steps_escaped_and_cut() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id = enqueue(&c, &NewJob::new("t", json!({}))).await.unwrap();
    c.execute(
        "INSERT INTO pgwake.job_steps (job_id, name, output, attempt)
         VALUES ($1, 'charge', jsonb_build_object('v', E'\\u001b[2Jpay\\u202efdp'), 1),
                ($1, 'big', to_jsonb(repeat('y', 5000)), 2)",
        &[&id],
    )
    .await
    .unwrap();
    let o = run_pgwake(&["job", "show", &id.to_string()], Some(&db.url));
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("steps\n"), "{out}");
    assert!(out.contains("  charge  attempt 1  "), "{out}");
    assert!(
        !out.contains('\u{1b}') && !out.contains('\u{202e}'),
        "a control character raw: {out:?}"
    );
    assert!(out.contains(&format!("\"{}…", "y".repeat(199))), "{out}");
    assert!(!out.contains(&"y".repeat(201)), "{out}");
}
