//! Under database pressure the all-queues claims (tx and lease) resume after the
//! last job claimed instead of walking the head of the claim index, where a
//! held vacuum horizon keeps the entries of every job claimed since
//! (src/claim/choose/cursor.rs, issue 35 item 1); one claim per
//! `pressure_head_scan_every` starts at the head for the jobs that sort
//! before the cursor. What it saves is measured by
//! scripts/bench-pinned-horizon.sh; these tests show the mechanism with a
//! job that sorts before the cursor (`run_at` an hour back, as a
//! producer's job committed late would), no timing involved.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use pgwake::{async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome, Worker};

const LONG: Duration = Duration::from_secs(60);

async fn insert(c: &tokio_postgres::Client, run_at: &str) -> i64 {
    c.query_one(
        &format!("INSERT INTO pgwake.jobs (task, run_at) VALUES ('work', {run_at}) RETURNING id"),
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

fn ran(ledger: &Ledger) -> HashSet<i64> {
    ledger.runs().iter().map(|r| r.0).collect()
}

async fn until_ran(ledger: &Ledger, what: &str, id: i64) {
    wait_for(what, LONG, async || {
        ran(ledger)
            .contains(&id)
            .then_some(())
            .ok_or(format!("{:?}", ledger.runs()))
    })
    .await;
}

/// Records each job it runs, in the delivery mode given.
struct InMode(Ledger, Delivery);

#[async_trait]
impl Handler for InMode {
    fn delivery(&self) -> Delivery {
        self.1
    }

    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.0.record(job);
        Ok(Outcome::Done)
    }
}

async fn level(c: &tokio_postgres::Client) -> String {
    c.query_one("SELECT level FROM pgwake.pressure_state", &[])
        .await
        .unwrap()
        .get(0)
}

/// A worker whose own sampler runs the governor (elevated after a horizon
/// held 1 s), one claim from the head per `head_every` under pressure;
/// returned once a horizon is held and the level is elevated, with the
/// pinning session.
async fn under_pressure(
    db: &TestDb,
    ledger: &Ledger,
    head_every: Duration,
    delivery: Delivery,
) -> (Running, tokio_postgres::Client) {
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 3600)",
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            sample_interval: Some(Duration::from_millis(100)),
            pressure_head_scan_every: head_every,
            ..test_config()
        })
        .handler("work", InMode(ledger.clone(), delivery))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    let pin = connect_as(db, "metabase").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    wait_for(
        "the worker's sampler to see the pressure",
        LONG,
        async || {
            let l = level(&c).await;
            (l == "elevated").then_some(()).ok_or(l)
        },
    )
    .await;
    (w, pin)
}

/// Under pressure a claim starts after the last job claimed: a job that
/// sorts before it waits while later jobs run; once the pressure is gone,
/// claims start at the head again and take it. Fails without the cursor
/// (the early job, first in claim order, runs with or before the later
/// one).
#[tokio::test]
async fn under_pressure_claims_resume_after_the_last_job_claimed_tx() {
    claims_resume_after_the_last_job_claimed(Delivery::Tx).await;
}

#[tokio::test]
async fn under_pressure_claims_resume_after_the_last_job_claimed_lease() {
    claims_resume_after_the_last_job_claimed(Delivery::Lease).await;
}

async fn claims_resume_after_the_last_job_claimed(delivery: Delivery) {
    let db = migrated_db().await;
    let c = db.client().await;
    let ledger = Ledger::default();
    let (w, pin) = under_pressure(&db, &ledger, Duration::from_secs(3600), delivery).await;
    // The first claim under pressure starts at the head and sets the cursor.
    let first = insert(&c, "now()").await;
    until_ran(&ledger, "the first job", first).await;
    let early = insert(&c, "now() - interval '1 hour'").await;
    let later = insert(&c, "now()").await;
    until_ran(&ledger, "the later job", later).await;
    assert!(
        !ran(&ledger).contains(&early),
        "a claim under pressure started at the head: {:?}",
        ledger.runs()
    );
    pin.batch_execute("COMMIT").await.unwrap();
    wait_for("the pressure to fall", LONG, async || {
        let l = level(&c).await;
        (l == "ok").then_some(()).ok_or(l)
    })
    .await;
    // A wake-up for the claim; without pressure it starts at the head.
    let next = insert(&c, "now()").await;
    until_ran(&ledger, "the early job, from the head", early).await;
    until_ran(&ledger, "the next job", next).await;
    w.shutdown().await;
}

/// Under pressure one claim per `pressure_head_scan_every` still starts at
/// the head: a job behind the cursor runs while the horizon is held. Fails
/// without the head claims (it waits for the pressure to end).
#[tokio::test]
async fn under_pressure_a_head_claim_takes_what_sorts_before_the_cursor_tx() {
    a_head_claim_takes_what_sorts_before_the_cursor(Delivery::Tx).await;
}

#[tokio::test]
async fn under_pressure_a_head_claim_takes_what_sorts_before_the_cursor_lease() {
    a_head_claim_takes_what_sorts_before_the_cursor(Delivery::Lease).await;
}

async fn a_head_claim_takes_what_sorts_before_the_cursor(delivery: Delivery) {
    let db = migrated_db().await;
    let c = db.client().await;
    let ledger = Ledger::default();
    let (w, pin) = under_pressure(&db, &ledger, Duration::from_millis(200), delivery).await;
    let first = insert(&c, "now()").await;
    until_ran(&ledger, "the first job", first).await;
    let early = insert(&c, "now() - interval '1 hour'").await;
    // Each new job wakes a claim; one of them, 200 ms after the last head
    // claim, starts at the head.
    wait_for("the early job, under pressure", LONG, async || {
        if ran(&ledger).contains(&early) {
            return Ok(());
        }
        insert(&c, "now()").await;
        Err(format!("{} runs, not the early job", ledger.runs().len()))
    })
    .await;
    assert_eq!(level(&c).await, "elevated", "still under pressure");
    pin.batch_execute("COMMIT").await.unwrap();
    w.shutdown().await;
}
