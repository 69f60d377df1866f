//! Results along a flow's edges (issue 36, item 3; docs/src/flows.md →
//! "Results"): a child reads its parents' results with
//! `JobContext::parent_results`, in both delivery modes, with history off;
//! a parent that ended dead under `on_parent_failure 'run'` gives its
//! error; results past `PARENT_RESULTS_MAX` are omitted with their size.

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob, ParentFailure};
use pgwake::{
    async_trait, BoxError, Handler, Job, JobContext, Outcome, ParentResult, Worker, WorkerConfig,
};

/// What each `consume` job read, by its id.
type Seen = Arc<Mutex<HashMap<i64, BTreeMap<i64, ParentResult>>>>;

/// `produce` returns its payload's `value` as its result; `fail` fails for
/// good; `consume` records what its parents left it.
struct Flow {
    seen: Seen,
}

#[async_trait]
impl Handler for Flow {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        match job.task.as_str() {
            "produce" => Ok(Outcome::done_with(job.payload["value"].clone())),
            "fail" => Ok(Outcome::fail("the parent broke")),
            _ => {
                let got = ctx.parent_results().await?;
                self.seen.lock().unwrap().insert(job.id, got);
                Ok(Outcome::Done)
            }
        }
    }
}

fn start(db: &TestDb, lease: bool, seen: &Seen) -> Running {
    let config = WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        concurrency: 4,
        ..test_config()
    };
    let mut builder = Worker::builder(db.config()).config(config);
    for task in ["produce", "fail", "consume"] {
        builder = builder.handler(task, Flow { seen: seen.clone() });
    }
    Running::start(builder.build().unwrap())
}

/// Two parents with results and one that ends dead fan in to a child that
/// runs anyway ('run'): it sees both results and the dead parent's error.
/// Two parents with results of 700,000 bytes each fan in to another: the
/// first (by id) is received, the second would pass the 1 MiB cap and is
/// omitted with its size. History is off all along: the results live on
/// the edges. (With the worker's edge write switched off — keep_edge_results
/// returning at once, and lease_done_results' `kept` CTE removed — the
/// children see `Result(Null)` for every parent and this fails.)
async fn children_read_their_parents_results(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let job = |task: &str, value: serde_json::Value| {
        NewJob::new(task, serde_json::json!({ "value": value })).max_attempts(1)
    };
    let p1 = enqueue(&client, &job("produce", serde_json::json!({"n": 1})))
        .await
        .unwrap();
    let p2 = enqueue(&client, &job("produce", serde_json::json!("two")))
        .await
        .unwrap();
    let pf = enqueue(&client, &job("fail", serde_json::Value::Null))
        .await
        .unwrap();
    let child = enqueue(
        &client,
        &job("consume", serde_json::Value::Null)
            .after([p1, p2, pf])
            .on_parent_failure(ParentFailure::Run),
    )
    .await
    .unwrap();
    let big = "x".repeat(700_000);
    let b1 = enqueue(&client, &job("produce", serde_json::json!(big)))
        .await
        .unwrap();
    let b2 = enqueue(&client, &job("produce", serde_json::json!(big)))
        .await
        .unwrap();
    let capped = enqueue(
        &client,
        &job("consume", serde_json::Value::Null).after([b1, b2]),
    )
    .await
    .unwrap();

    let seen: Seen = Default::default();
    let worker = start(&db, lease, &seen);
    wait_for("both children to run", Duration::from_secs(60), async || {
        let n = seen.lock().unwrap().len();
        if n == 2 {
            Ok(())
        } else {
            Err(format!("{n} of 2 ran"))
        }
    })
    .await;
    worker.shutdown().await;

    let seen = seen.lock().unwrap();
    let got = &seen[&child];
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[&p1], ParentResult::Result(serde_json::json!({"n": 1})));
    assert_eq!(got[&p2], ParentResult::Result(serde_json::json!("two")));
    match &got[&pf] {
        ParentResult::Error(e) => assert!(e.contains("the parent broke"), "{e}"),
        other => panic!("the dead parent gave {other:?}"),
    }
    let got = &seen[&capped];
    assert_eq!(got[&b1], ParentResult::Result(serde_json::json!(big)));
    assert_eq!(got[&b2], ParentResult::Omitted { bytes: 700_002 });
    let history: i64 = db.scalar("SELECT count(*) FROM pgwake.finished_jobs").await;
    assert_eq!(history, 0, "history is off: the results came from the edges");
}

#[tokio::test]
async fn tx_mode_children_read_their_parents_results() {
    children_read_their_parents_results(false).await;
}

#[tokio::test]
async fn lease_mode_children_read_their_parents_results() {
    children_read_their_parents_results(true).await;
}
