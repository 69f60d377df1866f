//! A producer's open transaction never stalls a worker. A lease-mode job
//! with unique key K is running; a producer enqueues another job with K in a
//! transaction it keeps open (allowed: the running job is not waiting). The
//! running job's put-back (retry, rescue, dead-job retry) must not wait on
//! that producer: it gives up the key at once (the producer's job keeps
//! it), writes its outcome, and the worker's other outcomes and lease
//! renewals go on.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome, Resolution};
use pgwake::{Worker, WorkerConfig};
use tokio::sync::watch;

/// Long enough for any write that does not wait on the producer.
const SOON: Duration = Duration::from_secs(20);

/// A lease-mode handler that reports each start, waits until released,
/// then fails the jobs whose payload says `"fail": true`.
struct Gated {
    started: tokio::sync::mpsc::UnboundedSender<i64>,
    release: watch::Receiver<bool>,
}

#[async_trait]
impl Handler for Gated {
    fn delivery(&self) -> Delivery {
        Delivery::Lease
    }

    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let _ = self.started.send(job.id);
        let mut release = self.release.clone();
        release.wait_for(|r| *r).await?;
        if job.payload["fail"] == true {
            return Err("failing on purpose".into());
        }
        Ok(Outcome::Done)
    }
}

struct Setup {
    db: TestDb,
    worker: Running,
    started: tokio::sync::mpsc::UnboundedReceiver<i64>,
    release: watch::Sender<bool>,
}

async fn setup(config: WorkerConfig) -> Setup {
    let db = migrated_db().await;
    let (started_tx, started) = tokio::sync::mpsc::unbounded_channel();
    let (release, release_rx) = watch::channel(false);
    let worker = Worker::builder(db.config())
        .config(config)
        .handler(
            "gated",
            Gated {
                started: started_tx,
                release: release_rx,
            },
        )
        .build()
        .unwrap();
    let worker = Running::start(worker);
    worker.until_listening().await;
    Setup {
        db,
        worker,
        started,
        release,
    }
}

async fn until_started(s: &mut Setup, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    while ids.len() < n {
        let id = tokio::time::timeout(SOON, s.started.recv())
            .await
            .expect("jobs start")
            .unwrap();
        ids.push(id);
    }
    ids
}

/// A producer's transaction that inserted a job with `key` and stays open.
async fn producer_holding(db: &TestDb, key: &str) -> tokio_postgres::Client {
    let producer = db.client().await;
    producer
        .batch_execute(&format!(
            "BEGIN; INSERT INTO pgwake.jobs (task, queue, unique_key, run_at) VALUES ('gated', 'elsewhere', '{key}', now() + interval '1 day')"
        ))
        .await
        .unwrap();
    producer
}

#[tokio::test]
async fn a_retry_never_waits_for_a_producer_holding_its_unique_key() {
    let mut s = setup(WorkerConfig {
        retry_base: Duration::from_secs(3600),
        retry_max: Duration::from_secs(3600),
        ..test_config()
    })
    .await;
    let c = s.db.client().await;
    let failing = enqueue(
        &c,
        &NewJob::new("gated", serde_json::json!({"fail": true})).unique_key("report:7"),
    )
    .await
    .unwrap();
    let other = enqueue(&c, &NewJob::new("gated", serde_json::json!({})))
        .await
        .unwrap();
    until_started(&mut s, 2).await;
    let producer = producer_holding(&s.db, "report:7").await;

    s.release.send(true).unwrap();
    // Both outcomes are written (the failure's put-back did not wait on the
    // producer, and the other job's completion did not queue behind it).
    let events = s
        .worker
        .next_events(2, SOON, |e| e.id == failing || e.id == other)
        .await;
    for e in &events {
        let expect_retry = e.id == failing;
        assert_eq!(
            matches!(e.resolution, Resolution::Retry { .. }),
            expect_retry,
            "{e:?}"
        );
    }
    let row = c
        .query_one(
            "SELECT attempts, unique_key FROM pgwake.jobs WHERE id = $1",
            &[&failing],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1, "the failed attempt is counted");
    assert_eq!(
        row.get::<_, Option<String>>(1),
        None,
        "the producer's job keeps the key"
    );

    producer.batch_execute("COMMIT").await.unwrap();
    let holders: i64 =
        s.db.scalar("SELECT count(*) FROM pgwake.jobs WHERE unique_key = 'report:7'")
            .await;
    assert_eq!(holders, 1);
    s.worker.shutdown().await;
}

#[tokio::test]
async fn a_rescue_and_a_dead_job_retry_never_wait_for_a_producer_holding_the_key() {
    let db = migrated_db().await;
    let c = db.client().await;
    // An expired lease with key K and a dead job with key D, as a crashed
    // worker and a failed job leave them.
    c.batch_execute(
        "INSERT INTO pgwake.leased_jobs (id, queue, task, payload, priority, run_at, attempts,
             max_attempts, created_at, worker_id, leased_at, lease_until, unique_key)
         VALUES (900001, 'default', 't', '{}', 0, now(), 1, 25, now(), 'gone', now() - interval '2 min',
                 now() - interval '1 min', 'K');
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
             max_attempts, last_error, created_at, unique_key)
         VALUES (900002, 'default', 't', '{}', 0, now(), 25, 25, 'boom', now(), 'D');",
    )
    .await
    .unwrap();
    let holding_k = producer_holding(&db, "K").await;
    let holding_d = producer_holding(&db, "D").await;

    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let rescuer = pgwake::internal::rescuer::Rescuer::new(
        pool,
        pgwake::internal::rescuer::RescuerConfig::every(Duration::from_secs(60)),
    );
    let report = tokio::time::timeout(SOON, rescuer.run_once())
        .await
        .expect("the rescue does not wait on the producer")
        .unwrap();
    assert_eq!(report.requeued, 1, "{report:?}");
    let retried = tokio::time::timeout(
        SOON,
        pgwake::admin::dead::retry(
            &c,
            &pgwake::admin::dead::Selection {
                ids: Some(vec![900002]),
                queue: None,
                all: false,
            },
        ),
    )
    .await
    .expect("the retry does not wait on the producer")
    .unwrap();
    assert_eq!(retried, vec![900002]);
    for id in [900001_i64, 900002] {
        let key: Option<String> = c
            .query_one("SELECT unique_key FROM pgwake.jobs WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0);
        assert_eq!(
            key, None,
            "job {id} is back without the key the producer holds"
        );
    }
    holding_k.batch_execute("COMMIT").await.unwrap();
    holding_d.batch_execute("COMMIT").await.unwrap();
    let holders: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE unique_key IN ('K', 'D')")
        .await;
    assert_eq!(holders, 2);
}

#[tokio::test]
async fn lease_renewals_never_wait_on_a_locked_lease_row() {
    let mut s = setup(WorkerConfig {
        lease_duration: Duration::from_secs(3),
        ..test_config()
    })
    .await;
    let c = s.db.client().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(
            enqueue(&c, &NewJob::new("gated", serde_json::json!({})))
                .await
                .unwrap(),
        );
    }
    until_started(&mut s, 2).await;
    let (busy, other) = (ids[0], ids[1]);
    // Another session holds `busy`'s lease row locked, as an outcome write
    // in flight does.
    let locker = s.db.client().await;
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM pgwake.leased_jobs WHERE id = {busy} FOR UPDATE"
        ))
        .await
        .unwrap();
    let before: std::time::SystemTime = c
        .query_one(
            "SELECT lease_until FROM pgwake.leased_jobs WHERE id = $1",
            &[&other],
        )
        .await
        .unwrap()
        .get(0);
    eventually("the other lease is renewed", SOON, || async {
        let now: std::time::SystemTime = c
            .query_one(
                "SELECT lease_until FROM pgwake.leased_jobs WHERE id = $1",
                &[&other],
            )
            .await
            .unwrap()
            .get(0);
        now > before
    })
    .await;
    locker.batch_execute("ROLLBACK").await.unwrap();
    s.release.send(true).unwrap();
    let ev = s
        .worker
        .next_events(1, SOON, |e| e.id == other)
        .await
        .remove(0);
    assert_eq!(ev.resolution, Resolution::Done);
    s.worker.shutdown().await;
}
