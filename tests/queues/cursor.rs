//! Under database pressure the claims (tx and lease, over every queue or of
//! one queue by name) resume after the last job claimed instead of walking
//! the head of the claim index, where a
//! held vacuum horizon keeps the entries of every job claimed since
//! (src/claim/choose/cursor.rs, issue 35 item 1); one claim per
//! `pressure_head_scan_every` starts at the head for the jobs that sort
//! before the cursor. What it saves is measured by
//! scripts/bench-pinned-horizon.sh; these tests show the mechanism with a
//! job that sorts before the cursor (`run_at` an hour back, as a
//! producer's job committed late would), no timing involved.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
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

/// The ready-queues read of the fair claims over every queue
/// (`pgwake.ready_queues`, fair.rs) under a held horizon: each queue's
/// probe finds the queue's first job this snapshot sees, and the check for
/// a ready job starts there, so the entries of the jobs claimed since the
/// horizon was held are walked once. The check started at the queue's first
/// entry: two walks, about twice the buffers (48 ms a read, up to 119 ms,
/// after three pinned minutes at 1,500 jobs/s). A queue whose first job is
/// scheduled is still listed when a later one is ready.
#[tokio::test]
async fn under_a_held_horizon_the_ready_queues_read_walks_the_claimed_jobs_entries_once() {
    let db = migrated_db().await;
    let c = db.client().await;
    let _pin = hold_horizon(&db, "pinning-session").await;
    leave_claimed_jobs(&c, 20_000, "now() - interval '1 minute'").await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (task, run_at) SELECT 'work', now() - interval '1 minute' FROM generate_series(1, 10);
         INSERT INTO pgwake.jobs (queue, task, priority, run_at) VALUES
             ('later', 'work', 0, now() + interval '1 hour'), ('later', 'work', 1, now() - interval '1 minute'),
             ('scheduled', 'work', 0, now() + interval '1 hour');
         ANALYZE pgwake.jobs;",
    )
    .await
    .unwrap();
    // The function plans its statement once per session: the helper runs
    // it once before it counts.
    assert_walks_once(
        &c,
        "SELECT id FROM pgwake.jobs WHERE queue = 'default' ORDER BY queue, priority, run_at, id LIMIT 1",
        "SELECT * FROM pgwake.ready_queues('{}', 1000)",
        "the ready-queues read",
    )
    .await;
    let listed: Vec<String> = c
        .query("SELECT * FROM pgwake.ready_queues('{}', 1000)", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(listed, ["default", "later"]);
}

/// Until the worker's claims resume after their cursor (`resume`), or
/// start at the head again.
async fn until_claims_resume(w: &Running, resume: bool, what: &str) {
    wait_for(what, LONG, async || {
        (w.health.claims_resume() == resume)
            .then_some(())
            .ok_or("not yet".to_string())
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
    let config = pgwake::WorkerConfig {
        sample_interval: Some(Duration::from_millis(100)),
        pressure_head_scan_every: head_every,
        ..test_config()
    };
    under_pressure_with(db, config, InMode(ledger.clone(), delivery)).await
}

/// [`under_pressure`] with a worker of `config` running `handler` as `work`.
async fn under_pressure_with(
    db: &TestDb,
    config: pgwake::WorkerConfig,
    handler: impl Handler + 'static,
) -> (Running, tokio_postgres::Client) {
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 3600)",
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(config)
        .handler("work", handler)
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    let pin = hold_horizon(db, "metabase").await;
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
    claims_resume_after_the_last_job_claimed(Delivery::Tx, None).await;
}

#[tokio::test]
async fn under_pressure_claims_resume_after_the_last_job_claimed_lease() {
    claims_resume_after_the_last_job_claimed(Delivery::Lease, None).await;
}

/// `queue`: the worker claims that queue by name (`--queues`), and the
/// jobs go there; `None`: the worker claims every queue.
async fn claims_resume_after_the_last_job_claimed(delivery: Delivery, queue: Option<&str>) {
    let db = migrated_db().await;
    let c = db.client().await;
    let ledger = Ledger::default();
    let config = pgwake::WorkerConfig {
        queues: queue.map(|q| vec![q.to_string()]),
        sample_interval: Some(Duration::from_millis(100)),
        pressure_head_scan_every: Duration::from_secs(3600),
        ..test_config()
    };
    let (w, pin) = under_pressure_with(&db, config, InMode(ledger.clone(), delivery)).await;
    let insert = async |run_at: &str| -> i64 {
        let queue = queue.unwrap_or("default");
        c.query_one(
            &format!(
                "INSERT INTO pgwake.jobs (queue, task, run_at) VALUES ('{queue}', 'work', {run_at}) RETURNING id"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0)
    };
    // The first claim under pressure starts at the head and sets the cursor.
    let first = insert("now()").await;
    until_ran(&ledger, "the first job", first).await;
    let early = insert("now() - interval '1 hour'").await;
    let later = insert("now()").await;
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
    let next = insert("now()").await;
    until_ran(&ledger, "the early job, from the head", early).await;
    until_ran(&ledger, "the next job", next).await;
    w.shutdown().await;
}

/// The same for a worker claiming its queues by name (`--queues`, and the
/// fair claims over several ready queues): each queue's claims resume after
/// the last job claimed from it, in its range of the (queue, priority,
/// run_at, id) index. Fails without the per-queue cursor (the early job
/// runs first).
#[tokio::test]
async fn under_pressure_claims_of_one_queue_resume_after_the_last_job_claimed_tx() {
    claims_resume_after_the_last_job_claimed(Delivery::Tx, Some("named")).await;
}

#[tokio::test]
async fn under_pressure_claims_of_one_queue_resume_after_the_last_job_claimed_lease() {
    claims_resume_after_the_last_job_claimed(Delivery::Lease, Some("named")).await;
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

/// Between its samples the sampler reads the oldest transaction's age once
/// a second (services/sampler.rs, `HORIZON_PROBE_EVERY`), so claims resume
/// after their cursor within about a second of a transaction reaching 5 s,
/// not a sample interval later. With samples an hour apart, a transaction
/// held open turns `claims_resume` on. Fails without the probe (the next
/// sample is an hour away).
#[tokio::test]
async fn a_held_horizon_is_seen_between_samples() {
    let db = migrated_db().await;
    let worker = Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            sample_interval: Some(Duration::from_secs(3600)),
            ..test_config()
        })
        .handler("work", InMode(Ledger::default(), Delivery::Tx))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    assert!(!w.health.claims_resume(), "nothing holds the horizon yet");
    let pin = hold_horizon(&db, "metabase").await;
    until_claims_resume(&w, true, "the worker to see the transaction held open").await;
    pin.batch_execute("COMMIT").await.unwrap();
    until_claims_resume(&w, false, "the worker to see it end").await;
    w.shutdown().await;
}

/// At a high claim rate a held transaction turns the cursor on before it
/// is 5 s old (health.rs `horizon_held`: from 1 s, once the worker has
/// claimed `horizon_held_claims` jobs since the transaction began; each of
/// them left an index entry that every claim from the head walks). A
/// producer keeps jobs coming while a transaction is held; when the
/// worker's claims resume after their cursor, the transaction is younger
/// than 5 s (its age read after the switch was seen, so the switch came
/// earlier still). Fails with the claim rate left out of the decision (the
/// switch then comes at 5 s).
#[tokio::test]
async fn at_a_high_claim_rate_a_held_horizon_is_seen_before_five_seconds() {
    let db = migrated_db().await;
    let worker = Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            sample_interval: Some(Duration::from_secs(3600)),
            horizon_held_claims: 100,
            ..test_config()
        })
        .handler("work", InMode(Ledger::default(), Delivery::Tx))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    let producing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let producer = {
        let (c, producing) = (db.client().await, producing.clone());
        tokio::spawn(async move {
            while producing.load(std::sync::atomic::Ordering::Relaxed) {
                c.batch_execute(
                    "INSERT INTO pgwake.jobs (task) SELECT 'work' FROM generate_series(1, 20)",
                )
                .await
                .unwrap();
            }
        })
    };
    let pin = hold_horizon(&db, "report").await;
    until_claims_resume(&w, true, "the worker to see the transaction held open").await;
    let age: f64 = db
        .scalar(
            "SELECT extract(epoch FROM now() - xact_start)::float8 FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'report'",
        )
        .await;
    assert!(
        age < 5.0,
        "claims resumed after their cursor only once the transaction was {age:.2} s old"
    );
    producing.store(false, std::sync::atomic::Ordering::Relaxed);
    producer.await.unwrap();
    pin.batch_execute("COMMIT").await.unwrap();
    w.shutdown().await;
}
