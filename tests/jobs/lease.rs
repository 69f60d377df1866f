//! Lease mode: no transaction held while a job runs, fenced completion,
//! rescues that requeue each expired lease exactly once.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::internal::rescuer::Rescuer;
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};
use tokio::sync::{Notify, Semaphore};

fn lease_config(lease: Duration) -> WorkerConfig {
    WorkerConfig {
        lease_queues: vec!["default".into()],
        lease_duration: lease,
        rescue_interval: Duration::from_secs(3600),
        ..test_config()
    }
}

/// Signals when it starts, then waits for `release` and returns `result`.
struct Gate {
    started: Arc<Semaphore>,
    release: Arc<Notify>,
    cancelled: Arc<Semaphore>,
    fail: bool,
}

#[async_trait]
impl Handler for Gate {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        assert!(
            ctx.transaction().await.unwrap().is_none(),
            "lease mode runs outside any transaction"
        );
        self.started.add_permits(1);
        // Cancellation drops this future: the guard reports it.
        let mut guard = DropGuard {
            on_drop: Some(self.cancelled.clone()),
        };
        tokio::select! {
            _ = self.release.notified() => {}
            _ = ctx.cancelled().cancelled() => std::future::pending::<()>().await,
        }
        guard.on_drop = None;
        if self.fail {
            return Err(format!("late failure of attempt {}", job.attempt).into());
        }
        Ok(Outcome::Done)
    }
}

struct DropGuard {
    on_drop: Option<Arc<Semaphore>>,
}

impl Drop for DropGuard {
    fn drop(&mut self) {
        if let Some(s) = self.on_drop.take() {
            s.add_permits(1);
        }
    }
}

fn gate(fail: bool) -> (Gate, Arc<Semaphore>, Arc<Notify>, Arc<Semaphore>) {
    let started = Arc::new(Semaphore::new(0));
    let release = Arc::new(Notify::new());
    let cancelled = Arc::new(Semaphore::new(0));
    (
        Gate {
            started: started.clone(),
            release: release.clone(),
            cancelled: cancelled.clone(),
            fail,
        },
        started,
        release,
        cancelled,
    )
}

async fn expire_and_rescue(db: &TestDb) -> pgwake::internal::rescuer::RescueReport {
    let client = db.client().await;
    client
        .batch_execute("UPDATE pgwake.leased_jobs SET lease_until = now() - interval '1 second'")
        .await
        .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
    Rescuer::new(
        pool,
        pgwake::internal::rescuer::RescuerConfig::every(Duration::from_secs(1)),
    )
    .run_once()
    .await
    .unwrap()
}

#[tokio::test]
async fn a_running_lease_job_holds_no_transaction() {
    let db = migrated_db().await;
    let (g, started, release, _) = gate(false);
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            application_name: "pgwake-lease-idle".into(),
            // Only the lease queue: no tx-mode claims at all on this worker.
            queues: Some(vec!["default".into()]),
            ..lease_config(Duration::from_secs(30))
        })
        .handler("t", g)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let id = insert_jobs(&db, "t", 1).await[0];
    started.acquire().await.unwrap().forget();
    let in_tx: i64 = db
        .scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgwake-lease-idle%' AND state LIKE 'idle in transaction%'")
        .await;
    assert_eq!(
        in_tx, 0,
        "no session of the worker is in a transaction while the job runs"
    );
    let leased: (i32, bool) = {
        let r = db
            .client()
            .await
            .query_one(
                "SELECT attempts, lease_until > now() FROM pgwake.leased_jobs WHERE id = $1",
                &[&id],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(
        leased,
        (1, true),
        "the attempt is counted and the lease is live"
    );
    release.notify_one();
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!(ev[0].outcome(), "done");
    w.shutdown().await;
    let left: i64 = db
        .scalar(
            "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)",
        )
        .await;
    assert_eq!(left, 0);
}

#[tokio::test]
async fn the_heartbeat_keeps_a_long_job_leased() {
    let db = migrated_db().await;
    let (g, started, release, _) = gate(false);
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            rescue_interval: Duration::from_millis(100),
            ..lease_config(Duration::from_secs(1))
        })
        .handler("t", g)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let id = insert_jobs(&db, "t", 1).await[0];
    started.acquire().await.unwrap().forget();
    let client = db.client().await;
    let first: std::time::SystemTime = client
        .query_one(
            "SELECT lease_until FROM pgwake.leased_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    // Outlive the first lease several times over while the rescuer runs
    // every 100 ms: the heartbeat must keep moving lease_until.
    eventually(
        "lease renewed past three of its lengths",
        Duration::from_secs(30),
        || {
            let client = &client;
            async move {
                let until: Option<std::time::SystemTime> = client
                    .query_opt(
                        "SELECT lease_until FROM pgwake.leased_jobs WHERE id = $1",
                        &[&id],
                    )
                    .await
                    .unwrap()
                    .map(|r| r.get(0));
                let until = until.expect("never rescued while alive");
                until > first + Duration::from_secs(3)
            }
        },
    )
    .await;
    release.notify_one();
    let ev = w.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!((ev[0].id, ev[0].attempt, ev[0].outcome()), (id, 1, "done"));
    w.shutdown().await;
}

#[tokio::test]
async fn a_late_completion_after_a_rescue_is_fenced_and_does_not_resurrect_the_job() {
    let db = migrated_db().await;
    // A: slow, its heartbeat far apart (it does not notice the rescue), and
    // it fails late: its write-back must not put the job back.
    let (slow, started, release, _) = gate(true);
    let a = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            ..lease_config(Duration::from_secs(600))
        })
        .handler("t", slow)
        .build()
        .unwrap();
    let mut a = Running::start(a);
    let id = insert_jobs(&db, "t", 1).await[0];
    started.acquire().await.unwrap().forget();
    let report = expire_and_rescue(&db).await;
    assert_eq!(report.requeued, 1);
    // B runs the rescued job (attempt 2) to completion.
    let ledger = Ledger::default();
    let b = Worker::builder(db.config())
        .config(lease_config(Duration::from_secs(30)))
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut b = Running::start(b);
    let ev = b.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!((ev[0].id, ev[0].attempt, ev[0].outcome()), (id, 2, "done"));
    // Now A's attempt 1 ends with a failure; its requeue is fenced out.
    release.notify_one();
    let ev = a.next_events(1, Duration::from_secs(20), |_| true).await;
    assert_eq!((ev[0].id, ev[0].attempt), (id, 1));
    assert_eq!(ev[0].outcome(), "lost", "reported as not written: {ev:?}");
    a.shutdown().await;
    b.shutdown().await;
    let left: i64 = db
        .scalar("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs) + (SELECT count(*) FROM pgwake.dead_jobs)")
        .await;
    assert_eq!(left, 0, "the job stays done");
    assert_eq!(ledger.check(&[id]), vec![]);
}

#[tokio::test]
async fn a_heartbeat_that_finds_its_lease_gone_stops_the_handler() {
    let db = migrated_db().await;
    let (slow, started, _release, cancelled) = gate(false);
    let a = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            ..lease_config(Duration::from_millis(1500))
        })
        .handler("t", slow)
        .build()
        .unwrap();
    let mut a = Running::start(a);
    let id = insert_jobs(&db, "t", 1).await[0];
    started.acquire().await.unwrap().forget();
    assert_eq!(expire_and_rescue(&db).await.requeued, 1);
    // Within a heartbeat the handler is told to stop.
    tokio::time::timeout(Duration::from_secs(20), cancelled.acquire())
        .await
        .expect("the handler was cancelled")
        .unwrap()
        .forget();
    let ev = a
        .next_events(1, Duration::from_secs(20), |e| e.attempt == 1)
        .await;
    assert_eq!((ev[0].id, ev[0].outcome()), (id, "lost"));
    a.abort.cancel();
    a.shutdown().await;
    let back: i32 = db
        .scalar(&format!("SELECT attempts FROM pgwake.jobs WHERE id = {id}"))
        .await;
    assert_eq!(
        back, 1,
        "the rescued job waits in the queue with its attempt counted"
    );
}

#[tokio::test]
async fn two_rescuers_at_once_requeue_each_expired_lease_exactly_once() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgwake.leased_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at, worker_id, lease_until)
             SELECT g, 'default', 't', '{}', 0, now(), 1 + (g % 2), 2, now(), 'gone', now() - interval '1 minute'
             FROM generate_series(1, 500) g",
        )
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
        tasks.push(tokio::spawn(async move {
            let r = Rescuer::new(
                pool,
                pgwake::internal::rescuer::RescuerConfig::every(Duration::from_secs(1)),
            );
            let mut total = pgwake::internal::rescuer::RescueReport::default();
            loop {
                let once = r.run_once().await.unwrap();
                if once.requeued + once.dead == 0 {
                    return total;
                }
                total.requeued += once.requeued;
                total.dead += once.dead;
            }
        }));
    }
    let (mut requeued, mut dead) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        requeued += r.requeued;
        dead += r.dead;
    }
    assert_eq!(
        (requeued, dead),
        (250, 250),
        "odd ids had attempts 2 of 2: dead; even ids back"
    );
    let jobs: i64 = client
        .query_one("SELECT count(DISTINCT id) FROM pgwake.jobs", &[])
        .await
        .unwrap()
        .get(0);
    let buried: i64 = client.query_one("SELECT count(*) FROM pgwake.dead_jobs WHERE last_error LIKE 'lease expired on the last attempt%'", &[]).await.unwrap().get(0);
    let leased: i64 = client
        .query_one("SELECT count(*) FROM pgwake.leased_jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!((jobs, buried, leased), (250, 250, 0));
}

#[tokio::test]
async fn lease_mode_failure_retries_then_goes_dead_and_tx_queues_stay_in_tx_mode() {
    let db = migrated_db().await;
    let client = db.client().await;
    let lease_job = enqueue(
        &client,
        &NewJob::new("fail", serde_json::json!({})).max_attempts(2),
    )
    .await
    .unwrap();
    let tx_job = enqueue(
        &client,
        &NewJob::new("tx", serde_json::json!({})).queue("short"),
    )
    .await
    .unwrap();
    struct InTx;
    #[async_trait]
    impl Handler for InTx {
        async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
            assert!(
                ctx.transaction().await.unwrap().is_some(),
                "queue `short` is a tx-mode queue"
            );
            Ok(Outcome::Done)
        }
    }
    let worker = Worker::builder(db.config())
        .config(lease_config(Duration::from_secs(30)))
        .handler(
            "fail",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &Job| Err("nope".into()),
            },
        )
        .handler("tx", InTx)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let evs = w.next_events(3, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    let of = |id: i64| {
        evs.iter()
            .filter(|e| e.id == id)
            .map(|e| (e.attempt, e.outcome()))
            .collect::<Vec<_>>()
    };
    assert_eq!(of(lease_job), vec![(1, "retry"), (2, "dead")]);
    assert_eq!(of(tx_job), vec![(1, "done")]);
}

/// A claim statement per lease: one row per job it moved, with the
/// transaction that moved it (a lease claim is one autocommit statement).
async fn record_claim_statements(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE public.lease_claims (id bigint, xact bigint);
             CREATE FUNCTION public.record_lease_claim() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO public.lease_claims VALUES (NEW.id, txid_current());
                 RETURN NULL;
             END $$;
             CREATE TRIGGER record_lease_claim AFTER INSERT ON pgwake.leased_jobs
                 FOR EACH ROW EXECUTE FUNCTION public.record_lease_claim();",
        )
        .await
        .unwrap();
}

/// Every lease claim statement, empty ones too, takes 10 ms longer (a
/// statement trigger fires whether or not rows are inserted): the claim's
/// own time, standing for a server under load, so that what happens while
/// a claim is in flight does not depend on how the test's threads are
/// scheduled.
async fn slow_claims(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION public.slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(0.01); RETURN NULL; END $$;
             CREATE TRIGGER slow_claim BEFORE INSERT ON pgwake.leased_jobs
                 FOR EACH STATEMENT EXECUTE FUNCTION public.slow_claim();",
        )
        .await
        .unwrap();
}

/// With one lease claim in flight per worker (claimer.rs, `LeaseTurn`), a
/// claim takes every slot freed while the previous one was in flight. One
/// claim per task had each of the 8 tasks hold the slot it claimed with, so
/// no slot was ever free when a claim was sent: 400 jobs took 400 claim
/// statements. Every job still runs exactly once. (The no-op jobs end
/// while a claim is in flight: `slow_claims`.)
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_backlog_is_claimed_several_jobs_per_statement() {
    let db = migrated_db().await;
    record_claim_statements(&db).await;
    slow_claims(&db).await;
    let ids = insert_jobs(&db, "t", 400).await;
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 8,
            batch: 100,
            queues: Some(vec!["default".into()]),
            ..lease_config(Duration::from_secs(30))
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let w = Running::start(worker);
    until_drained(&db).await;
    w.shutdown().await;
    assert_eq!(ledger.check(&ids), vec![], "jobs not run exactly once");
    let (claims, jobs): (i64, i64) = {
        let r = db
            .client()
            .await
            .query_one(
                "SELECT count(DISTINCT xact), count(*) FROM public.lease_claims",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(jobs, 400);
    assert!(
        claims * 2 <= jobs,
        "{claims} lease claim statements for {jobs} jobs: fewer than 2 jobs per claim"
    );
}

/// Waits for a permit of `go`, saying when it starts.
struct WaitForGo {
    started: Arc<Semaphore>,
    go: Arc<Semaphore>,
}

#[async_trait]
impl Handler for WaitForGo {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.started.add_permits(1);
        self.go.acquire().await?.forget();
        Ok(Outcome::Done)
    }
}

/// A claim for the prefetch buffer takes, besides its free slots, what
/// `--batch` leaves or a third of the buffer (prefetch.rs, `CLAIM_SHARE`),
/// whichever is more, not `--batch` in all: a fast worker's buffer is
/// filled by few large claims, two in flight, instead of one claim of
/// `--batch` after another on one backend (issue 34, item 9). Here both slots hold running jobs while the
/// buffer (30) fills: with the claim bounded by `--batch` (4), as before,
/// no claim statement moves more than 4 jobs and this fails.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_for_the_prefetch_buffer_takes_a_third_of_it_beyond_the_batch() {
    let db = migrated_db().await;
    record_claim_statements(&db).await;
    insert_jobs(&db, "t", 100).await;
    let (started, go) = (Arc::new(Semaphore::new(0)), Arc::new(Semaphore::new(0)));
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 2,
            batch: 4,
            prefetch: Some(30),
            // Never handed back while both slots are held.
            prefetch_wait: Duration::from_secs(3600),
            queues: Some(vec!["default".into()]),
            ..lease_config(Duration::from_secs(30))
        })
        .handler(
            "t",
            WaitForGo {
                started: started.clone(),
                go: go.clone(),
            },
        )
        .build()
        .unwrap();
    let w = Running::start(worker);
    started.acquire_many(2).await.unwrap().forget();
    let largest = async || -> i64 {
        db.scalar("SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM public.lease_claims GROUP BY xact) c")
            .await
    };
    eventually(
        "a lease claim statement moving more than --batch (4) jobs: a refill of the buffer held to --batch",
        Duration::from_secs(60),
        || async { largest().await > 4 },
    )
    .await;
    let largest = largest().await;
    assert!(
        largest <= 2 + 10,
        "the largest lease claim moved {largest} jobs: more than its free slots (2) and a third of the buffer (10)"
    );
    go.add_permits(1000);
    until_drained(&db).await;
    w.shutdown().await;
}

/// A task that finds another task's lease claim in flight goes back to idle
/// and leaves a request that the claiming task serves with one more claim
/// (the turn's logic has unit tests in claimer.rs). Each job here is
/// inserted once the one before it has run: right when the claiming task,
/// having found a job, sends its next claim and finds nothing (its snapshot
/// predates the insert), so the task woken by the insert is turned away.
/// Every job must run with the poll an hour away. (The waiting
/// registration's re-check when the worker goes idle, waiting.rs, would
/// also bring such a job in, some 50 ms later: this checks that the two
/// together lose nothing.)
#[tokio::test(flavor = "multi_thread")]
async fn lease_wake_ups_during_a_claim_in_flight_are_not_lost() {
    let db = migrated_db().await;
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 8,
            batch: 100,
            poll_interval: Duration::from_secs(3600),
            queues: Some(vec!["default".into()]),
            ..lease_config(Duration::from_secs(30))
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    // The next insert lands while the empty claim is in flight.
    slow_claims(&db).await;
    let w = Running::start(worker);
    w.until_waiting(&db).await;
    let producer = db.client().await;
    let mut ids = Vec::new();
    for n in 0..50usize {
        let id: i64 = producer
            .query_one(
                "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
        let l = ledger.clone();
        eventually(
            &format!("job {} of 50 to run (the poll is an hour away)", n + 1),
            Duration::from_secs(60),
            move || {
                let l = l.clone();
                async move { l.runs().len() > n }
            },
        )
        .await;
    }
    until_drained(&db).await;
    w.shutdown().await;
    assert_eq!(ledger.check(&ids), vec![], "jobs not run exactly once");
}

/// One expired lease that cannot be put back (here a producer, with only
/// its documented grants, inserted a job with an explicit id equal to the
/// leased job's) must not stop the rescue of the others: they go back, the
/// bad one is reported (error log, `pgwake_rescue_failures_total`) and stays
/// leased for an operator, and the next run rescues the rest again.
#[tokio::test]
async fn one_expired_lease_that_cannot_be_put_back_does_not_stop_the_others() {
    let handle = pgwake::metrics::install();
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.leased_jobs (id, queue, task, payload, priority, run_at, attempts,
             max_attempts, created_at, worker_id, leased_at, lease_until)
         SELECT 800000 + i, 'rescue_q', 't', '{}', 0, now(), 1, 25, now(), 'crashed',
                now() - interval '2 min', now() - interval '1 min' - i * interval '1 s'
         FROM generate_series(1, 5) i;
         -- Job 800003's id is taken in pgwake.jobs: it cannot go back.
         INSERT INTO pgwake.jobs (id, task, queue, run_at) VALUES (800003, 'other', 'elsewhere', now() + interval '1 day');",
    )
    .await
    .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
    let report = Rescuer::new(
        pool,
        pgwake::internal::rescuer::RescuerConfig::every(Duration::from_secs(1)),
    )
    .run_once()
    .await
    .unwrap();
    assert_eq!(report.requeued, 4, "{report:?}");
    assert_eq!(report.failed, 1, "{report:?}");
    let back: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue = 'rescue_q'")
        .await;
    assert_eq!(back, 4);
    let stuck: Vec<i64> = c
        .query("SELECT id FROM pgwake.leased_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(stuck, vec![800003], "the bad row stays, nothing is lost");
    let text = handle.render();
    let failures: f64 = text
        .lines()
        .filter(|l| l.starts_with("pgwake_rescue_failures_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(failures >= 1.0, "{text}");
}

/// Sleeps `ms` (the job's work), recording that it started.
struct Slow {
    ms: u64,
    started: Arc<std::sync::Mutex<std::collections::HashSet<i64>>>,
}

#[async_trait]
impl Handler for Slow {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.started.lock().unwrap().insert(job.id);
        tokio::time::sleep(Duration::from_millis(self.ms)).await;
        Ok(Outcome::Done)
    }
}

/// The default prefetch buffer holds about 50 ms of the worker's starts
/// (prefetch.rs, `Size::ByRate`): with jobs of 100 ms on two slots, a job
/// or so, never the 200 of its cap, although each claim may take 100
/// (`--batch`) and 28 jobs wait. So a `kill -9` charges few unused
/// attempts, and the jobs stay claimable by other workers. Read several
/// times while the worker drains. With the buffer fixed at its cap (switch
/// `None` in worker.rs's `Size` choice to `Size::Fixed(PREFETCH_CAP_DEFAULT)`,
/// or set `prefetch: Some(200)` here) up to 28 jobs sit in the buffer (26
/// in the run that checked it) and this fails.
#[tokio::test(flavor = "multi_thread")]
async fn the_default_prefetch_buffer_of_slow_jobs_holds_a_job_or_two() {
    let db = migrated_db().await;
    insert_jobs(&db, "slow", 30).await;
    let started = Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 2,
            batch: 100,
            prefetch: None,
            queues: Some(vec!["default".into()]),
            ..lease_config(Duration::from_secs(30))
        })
        .handler(
            "slow",
            Slow {
                ms: 100,
                started: started.clone(),
            },
        )
        .build()
        .unwrap();
    let w = Running::start(worker);
    let client = db.client().await;
    let mut most = 0;
    for reading in 1..=5 {
        let s = started.clone();
        eventually(
            &format!("{} jobs started", reading * 4),
            Duration::from_secs(60),
            move || {
                let s = s.clone();
                async move { s.lock().unwrap().len() >= reading * 4 }
            },
        )
        .await;
        let leased: Vec<i64> = client
            .query("SELECT id FROM pgwake.leased_jobs", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let buffered = {
            let s = started.lock().unwrap();
            leased.iter().filter(|id| !s.contains(id)).count()
        };
        most = most.max(buffered);
    }
    until_drained(&db).await;
    w.shutdown().await;
    assert!(
        most <= 3,
        "{most} jobs of 100 ms leased and not started at once: the default buffer should hold about 50 ms of starts"
    );
}

/// (worker, job, attempt) of each start.
type Starts = Arc<std::sync::Mutex<Vec<(&'static str, i64, i32)>>>;

/// Records which worker started which job (and its attempt), then waits
/// for `open`.
struct Held {
    worker: &'static str,
    starts: Starts,
    open: tokio_util::sync::CancellationToken,
}

#[async_trait]
impl Handler for Held {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.starts
            .lock()
            .unwrap()
            .push((self.worker, job.id, job.attempt));
        self.open.cancelled().await;
        Ok(Outcome::Done)
    }
}

/// A buffered job does not wait behind long runs while another worker is
/// idle. Worker `a` (2 slots, default prefetch) claims 3 long jobs: 2 run,
/// 1 waits in its buffer (leased, not started). Worker `b` starts idle.
/// With no start on `a` for `--prefetch-wait`, `a` hands its buffer back
/// (attempt refunded) and `b` runs the job while `a`'s two still run.
/// Without the hand-back (drop the `hand_back_stalled` service in
/// worker.rs) the job waits in `a`'s buffer until a run ends, and the wait
/// for `b` to start it times out.
#[tokio::test(flavor = "multi_thread")]
async fn a_job_buffered_behind_long_runs_goes_to_an_idle_worker() {
    let db = migrated_db().await;
    let ids = insert_jobs(&db, "long", 3).await;
    let starts: Starts = Arc::default();
    let open = tokio_util::sync::CancellationToken::new();
    let worker = |name: &'static str| {
        Worker::builder(db.config())
            .config(WorkerConfig {
                concurrency: 2,
                prefetch: None,
                // Long enough to see the job in the buffer first.
                prefetch_wait: Duration::from_secs(3),
                ..lease_config(Duration::from_secs(30))
            })
            .handler(
                "long",
                Held {
                    worker: name,
                    starts: starts.clone(),
                    open: open.clone(),
                },
            )
            .build()
            .unwrap()
    };
    let a = Running::start(worker("a"));
    let s = starts.clone();
    eventually("a to start two jobs", Duration::from_secs(60), move || {
        let s = s.clone();
        async move { s.lock().unwrap().len() == 2 }
    })
    .await;
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!(leased, 3, "a claimed the third job into its buffer");
    let buffered = ids
        .iter()
        .copied()
        .find(|id| !starts.lock().unwrap().iter().any(|s| s.1 == *id))
        .unwrap();
    let b = Running::start(worker("b"));
    let s = starts.clone();
    eventually(
        "b to start the job a buffered, while a's two runs go on",
        Duration::from_secs(60),
        move || {
            let s = s.clone();
            async move { s.lock().unwrap().iter().any(|s| s.1 == buffered) }
        },
    )
    .await;
    assert_eq!(
        starts
            .lock()
            .unwrap()
            .clone()
            .into_iter()
            .find(|s| s.1 == buffered),
        Some(("b", buffered, 1)),
        "the buffered job ran on b, its attempt refunded"
    );
    open.cancel();
    until_drained(&db).await;
    a.shutdown().await;
    b.shutdown().await;
    assert_eq!(starts.lock().unwrap().len(), 3, "each job ran once");
}

/// The statements that end or touch a lease find it by its claim token
/// through the token index, even on a cached connection after the table
/// was analyzed empty and then filled with dead rows (a held vacuum
/// horizon): a plan the server cached while the table was small would scan
/// every dead row on every outcome flush. Fails with these statements
/// cached like the claims' (20 sequential scans, one per statement).
#[tokio::test]
async fn lease_outcomes_walk_the_token_index_after_the_table_filled_with_dead_rows() {
    use pgwake::config::PreparedStatements;
    use pgwake::internal::sql::{Db, LEASE_DONE, LEASE_STARTED};
    let db = migrated_db().await;
    let client = db.client().await;
    // No vacuum may clean up behind the test: the dead rows stay, as they
    // do behind a held horizon; the statistics say the table is empty.
    for setup in [
        "ALTER TABLE pgwake.leased_jobs SET (autovacuum_enabled = off)",
        "VACUUM ANALYZE pgwake.leased_jobs",
        "INSERT INTO pgwake.jobs (task) SELECT 'lease-scan' FROM generate_series(1, 20100)",
    ] {
        client.batch_execute(setup).await.unwrap();
    }
    let claim = |n: i64| {
        let client = &client;
        async move {
            client
                .query(
                    "SELECT token FROM pgwake.claim_lease_queue($1, 'default', NULL, '{}', 'test', 600, $1)",
                    &[&n],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| r.get::<_, i64>(0))
                .collect::<Vec<i64>>()
        }
    };
    let pool = pgwake::connect::pool(&pgwake::connect::parse_url(&db.url).unwrap(), 1).unwrap();
    let conn = pool.get().await.unwrap();
    let cached = Db::pooled(&conn, PreparedStatements::Cached);
    // Used while the table is small: the server would cache a plan now.
    let small = claim(100).await;
    for chunk in small.chunks(10) {
        let tokens = chunk.to_vec();
        cached.execute(&LEASE_STARTED, &[&tokens]).await.unwrap();
        cached.query(&LEASE_DONE, &[&tokens]).await.unwrap();
    }
    // 20,000 dead rows: claimed, then done.
    let many = claim(20000).await;
    let (gone, live) = many.split_at(19900);
    client
        .execute(
            "DELETE FROM pgwake.leased_jobs WHERE token = ANY($1)",
            &[&gone.to_vec()],
        )
        .await
        .unwrap();
    // The session's counts not yet sent to the server's statistics show
    // in this view too (the small table's scans above, for a second): the
    // statements below are what the difference counts.
    let seq_scans = || async {
        conn.query_one(
            "SELECT seq_scan FROM pg_stat_xact_user_tables
             WHERE schemaname = 'pgwake' AND relname = 'leased_jobs'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
    };
    conn.batch_execute("BEGIN").await.unwrap();
    let before = seq_scans().await;
    for chunk in live.chunks(10) {
        let tokens = chunk.to_vec();
        cached.execute(&LEASE_STARTED, &[&tokens]).await.unwrap();
        let done = cached.query(&LEASE_DONE, &[&tokens]).await.unwrap();
        assert_eq!(done.len(), tokens.len());
    }
    let scans = seq_scans().await - before;
    conn.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(
        scans, 0,
        "{scans} sequential scans of pgwake.leased_jobs (20,000 dead rows) for 20 lease statements"
    );
}
