//! A new `--max-running` counts the jobs already running. Four jobs of a
//! queue run when the limit is set to 2 and four more are enqueued: no new
//! job starts until fewer than 2 run, in both delivery modes (jobs claimed
//! before the limit hold no slot; the limit must count them anyway — the
//! moment people set a limit is when a queue overloads something).

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome, Resolution};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(60);

/// Runs until the test releases the job's id; records, for each start,
/// how many jobs of the queue ran with it (itself included).
struct Held {
    delivery: Delivery,
    running: Arc<AtomicUsize>,
    starts: Arc<Mutex<Vec<(i64, usize)>>>,
    release: watch::Receiver<HashSet<i64>>,
}

#[async_trait]
impl Handler for Held {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.starts.lock().unwrap().push((job.id, now));
        let mut release = self.release.clone();
        let r = release
            .wait_for(|set| set.contains(&job.id))
            .await
            .map(|_| ());
        self.running.fetch_sub(1, Ordering::SeqCst);
        r?;
        Ok(Outcome::Done)
    }
}

/// `n` jobs of task `held` in queue `q`.
async fn enqueue_held(c: &tokio_postgres::Client, n: usize) -> Vec<i64> {
    let mut ids = Vec::new();
    for _ in 0..n {
        ids.push(
            enqueue(c, &NewJob::new("held", serde_json::json!({})).queue("q"))
                .await
                .unwrap(),
        );
    }
    ids
}

/// `crashed`: the four running jobs are suspects, each run alone after
/// their batch crashed (tx mode), which hold no queue slot either.
async fn a_new_limit_counts_the_jobs_already_running(delivery: Delivery, crashed: bool) {
    let db = migrated_db().await;
    let c = db.client().await;
    let mut old = Vec::new();
    if crashed {
        old = enqueue_held(&c, 4).await;
        mark_as_crashed_batch(&db, &old).await;
    }
    let running = Arc::new(AtomicUsize::new(0));
    let starts = Arc::new(Mutex::new(Vec::new()));
    let (release, release_rx) = watch::channel(HashSet::new());
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            concurrency: 8,
            batch: 1,
            ..test_config()
        })
        .handler(
            "held",
            Held {
                delivery,
                running: running.clone(),
                starts: starts.clone(),
                release: release_rx,
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    if !crashed {
        old = enqueue_held(&c, 4).await;
    }
    let r = running.clone();
    eventually("four jobs run", WAIT, || {
        let r = r.clone();
        async move { r.load(Ordering::SeqCst) == 4 }
    })
    .await;

    pgwake::admin::queues::set_max_running(&c, "q", Some(2))
        .await
        .unwrap();
    let new = enqueue_held(&c, 4).await;
    // Old jobs end one by one; new ones may start only below the limit.
    for id in &old {
        release.send_modify(|set| {
            set.insert(*id);
        });
        let ev = w.next_events(1, WAIT, |e| e.id == *id).await.remove(0);
        assert_eq!(ev.resolution, Resolution::Done);
    }
    for id in &new {
        let s = starts.clone();
        let id = *id;
        eventually("a new job starts", WAIT, || {
            let s = s.clone();
            async move { s.lock().unwrap().iter().any(|(j, _)| *j == id) }
        })
        .await;
        release.send_modify(|set| {
            set.insert(id);
        });
        w.next_events(1, WAIT, |e| e.id == id).await;
    }
    w.shutdown().await;
    let starts = starts.lock().unwrap().clone();
    for (id, with) in starts.iter().filter(|(id, _)| new.contains(id)) {
        assert!(
            *with <= 2,
            "job {id} started with {with} jobs of the queue running, limit 2: {starts:?}"
        );
    }
}

#[tokio::test]
async fn a_new_max_running_counts_running_tx_jobs() {
    a_new_limit_counts_the_jobs_already_running(Delivery::Tx, false).await;
}

#[tokio::test]
async fn a_new_max_running_counts_running_lease_jobs() {
    a_new_limit_counts_the_jobs_already_running(Delivery::Lease, false).await;
}

/// Suspects run alone hold no queue slot when their queue had no limit:
/// each is named in a mark of its own (`run_suspect`), which a limit set
/// while it runs counts.
///
/// Teeth: with `run_suspect` making no mark, new jobs start beside the four
/// suspects.
#[tokio::test]
async fn a_new_max_running_counts_running_suspects() {
    a_new_limit_counts_the_jobs_already_running(Delivery::Tx, true).await;
}

/// A prefetching lease worker claims a limited queue's jobs for its free
/// slots only: a buffered job would hold one of the queue's running slots
/// without running.
#[tokio::test]
async fn a_max_running_queue_is_never_prefetched() {
    let db = migrated_db().await;
    let c = db.client().await;
    pgwake::admin::queues::set_max_running(&c, "q", Some(10))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(
            enqueue(&c, &NewJob::new("held", serde_json::json!({})).queue("q"))
                .await
                .unwrap(),
        );
    }
    let running = Arc::new(AtomicUsize::new(0));
    let (release, release_rx) = watch::channel(HashSet::new());
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            concurrency: 2,
            prefetch: Some(4),
            ..test_config()
        })
        .handler(
            "held",
            Held {
                delivery: Delivery::Lease,
                running: running.clone(),
                starts: Arc::default(),
                release: release_rx,
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let r = running.clone();
    eventually("two jobs run", WAIT, || {
        let r = r.clone();
        async move { r.load(Ordering::SeqCst) == 2 }
    })
    .await;
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!(leased, 2, "only the running jobs hold the queue's slots");
    release.send_modify(|set| set.extend(ids.iter().copied()));
    let events = w.next_events(6, WAIT, |e| ids.contains(&e.id)).await;
    assert!(events.iter().all(|e| e.resolution == Resolution::Done));
    w.shutdown().await;
}

/// Pause with a prefetching lease worker: a claim after the pause takes
/// nothing from the queue, and the jobs claimed before it into the buffer
/// go back unstarted, attempt refunded (issue 33, item 3; before, they
/// still started: "at most --prefetch per worker"). Only the running job
/// finishes.
#[tokio::test]
async fn a_pause_takes_back_the_prefetched_jobs_and_only_the_running_one_finishes() {
    let db = migrated_db().await;
    let c = db.client().await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(
            enqueue(&c, &NewJob::new("held", serde_json::json!({})).queue("p"))
                .await
                .unwrap(),
        );
    }
    let running = Arc::new(AtomicUsize::new(0));
    let starts = Arc::new(Mutex::new(Vec::new()));
    let (release, release_rx) = watch::channel(HashSet::new());
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            concurrency: 1,
            prefetch: Some(2),
            ..test_config()
        })
        .handler(
            "held",
            Held {
                delivery: Delivery::Lease,
                running: running.clone(),
                starts: starts.clone(),
                release: release_rx,
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let r = running.clone();
    eventually("one job runs", WAIT, || {
        let r = r.clone();
        async move { r.load(Ordering::SeqCst) == 1 }
    })
    .await;
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    assert_eq!(leased, 3, "one running, two prefetched");
    pgwake::admin::queues::pause(&c, "p").await.unwrap();
    eventually("the prefetched jobs handed back", WAIT, || {
        let db = &db;
        async move {
            let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
            leased == 1
        }
    })
    .await;
    release.send_modify(|set| set.extend(ids.iter().copied()));
    let events = w
        .next_events(1, WAIT, |e| {
            ids.contains(&e.id) && e.resolution == Resolution::Done
        })
        .await;
    assert_eq!(events[0].id, ids[0], "the running job finishes");
    w.until_waiting(&db).await;
    let started: Vec<i64> = starts.lock().unwrap().iter().map(|s| s.0).collect();
    assert_eq!(started, ids[..1], "only the running job");
    let left: Vec<i32> = c
        .query("SELECT attempts FROM pgwake.jobs WHERE queue = 'p'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        left,
        vec![0, 0, 0],
        "three wait for the resume, never charged"
    );
    w.shutdown().await;
}
