//! Waits for a signal composed with the rest of pgwake (the table in
//! docs/src/handlers.md, "Waits with the rest of pgwake"), in both delivery
//! modes: a waiting job keeps its place in its ordering key but holds no
//! slot of its queue's `max_running`, and a waiting parent keeps its
//! children held until it ends.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, signal, NewJob};
use pgwake::{BoxError, Job, JobContext, Outcome, Worker, WorkerConfig};

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        ..test_config()
    }
}

/// The ids of the jobs whose handlers returned `Done`, in the order they
/// returned it. A job that can only be claimed once another has ended
/// starts after that one's handler returned, so this order is causal; the
/// order in which a worker's claim tasks publish their events is not.
type Ends = Arc<Mutex<Vec<i64>>>;

/// `wait`: waits for the signal its payload names, then is done. `quick`:
/// done at once.
struct Tasks(Ends);

#[pgwake::async_trait]
impl pgwake::Handler for Tasks {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if job.task == "quick" {
            self.0.lock().unwrap().push(job.id);
            return Ok(Outcome::Done);
        }
        Ok(match ctx.signal().await? {
            None => Outcome::wait_for(
                job.payload["key"].as_str().unwrap_or("k"),
                Duration::from_secs(3600),
            ),
            Some(_) => {
                self.0.lock().unwrap().push(job.id);
                Outcome::Done
            }
        })
    }
}

fn worker(db: &TestDb, lease: bool) -> (Running, Ends) {
    let ends = Ends::default();
    let w = Running::start(
        Worker::builder(db.config())
            .config(config(lease))
            .handler("wait", Tasks(ends.clone()))
            .handler("quick", Tasks(ends.clone()))
            .build()
            .unwrap(),
    );
    (w, ends)
}

async fn explain_reason(c: &tokio_postgres::Client, id: i64) -> String {
    c.query_one("SELECT reason FROM pgwake.explain($1) LIMIT 1", &[&id])
        .await
        .unwrap()
        .get(0)
}

/// The queue runs one job at a time (`max_running` 1). A waits for a
/// signal with ordering key k; B, enqueued next with key k, stays behind
/// it (the wait is part of A's work, the order is A's); C, enqueued last
/// with no key, runs while A waits: a waiting job holds no slot. After the
/// signal, A ends, then B runs. Without the ordering key B would run
/// before C (it is older); if a wait held its slot, C would not run.
async fn a_waiting_job_keeps_its_key_and_holds_no_slot(lease: bool) {
    let db = migrated_db().await;
    limit_queue(&db, "default", 1);
    let c = db.client().await;
    let a = enqueue(
        &c,
        &NewJob::new("wait", serde_json::json!({"key": "ship:1"})).ordering_key("k"),
    )
    .await
    .unwrap();
    let (mut w, ends) = worker(&db, lease);
    w.next_events(1, Duration::from_secs(30), |e| {
        e.id == a && e.outcome() == "waiting_for_signal"
    })
    .await;
    let b = enqueue(
        &c,
        &NewJob::new("quick", serde_json::json!({})).ordering_key("k"),
    )
    .await
    .unwrap();
    let cc = enqueue(&c, &NewJob::new("quick", serde_json::json!({})))
        .await
        .unwrap();
    let ran = w
        .next_events(1, Duration::from_secs(30), |e| e.outcome() == "done")
        .await;
    assert_eq!(ran[0].id, cc, "the job without a key ran while A waited");
    assert_eq!(explain_reason(&c, b).await, "ordering_key");
    assert_eq!(signal(&c, "ship:1", None).await.unwrap(), 1);
    w.next_events(2, Duration::from_secs(30), |e| e.outcome() == "done")
        .await;
    w.shutdown().await;
    let order = ends.lock().unwrap().clone();
    assert_eq!(order, [cc, a, b], "B after A, its key's head");
}

#[tokio::test]
async fn tx_mode_a_waiting_job_keeps_its_key_and_holds_no_slot() {
    a_waiting_job_keeps_its_key_and_holds_no_slot(false).await;
}

#[tokio::test]
async fn lease_mode_a_waiting_job_keeps_its_key_and_holds_no_slot() {
    a_waiting_job_keeps_its_key_and_holds_no_slot(true).await;
}

/// A parent that waits for a signal has not ended: its child stays held
/// (explain: waiting for its parents) until the signal resumes the parent
/// and it ends done, and then the child runs.
async fn a_waiting_parent_keeps_its_children_held(lease: bool) {
    let db = migrated_db().await;
    let c = db.client().await;
    let parent = enqueue(
        &c,
        &NewJob::new("wait", serde_json::json!({"key": "approve:7"})),
    )
    .await
    .unwrap();
    let child = enqueue(
        &c,
        &NewJob::new("quick", serde_json::json!({})).after([parent]),
    )
    .await
    .unwrap();
    let (mut w, ends) = worker(&db, lease);
    w.next_events(1, Duration::from_secs(30), |e| {
        e.id == parent && e.outcome() == "waiting_for_signal"
    })
    .await;
    // Something else runs after the wait, so the worker has had its chance.
    let other = enqueue(&c, &NewJob::new("quick", serde_json::json!({})))
        .await
        .unwrap();
    w.next_events(1, Duration::from_secs(30), |e| e.id == other)
        .await;
    assert_eq!(explain_reason(&c, child).await, "waiting_for_parents");
    assert_eq!(signal(&c, "approve:7", None).await.unwrap(), 1);
    w.next_events(2, Duration::from_secs(30), |e| e.outcome() == "done")
        .await;
    w.shutdown().await;
    let order = ends.lock().unwrap().clone();
    assert_eq!(order, [other, parent, child], "the child after its parent");
}

#[tokio::test]
async fn tx_mode_a_waiting_parent_keeps_its_children_held() {
    a_waiting_parent_keeps_its_children_held(false).await;
}

#[tokio::test]
async fn lease_mode_a_waiting_parent_keeps_its_children_held() {
    a_waiting_parent_keeps_its_children_held(true).await;
}
