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
    wait_for(
        "both children to run",
        Duration::from_secs(60),
        async || {
            let n = seen.lock().unwrap().len();
            if n == 2 {
                Ok(())
            } else {
                Err(format!("{n} of 2 ran"))
            }
        },
    )
    .await;
    worker.shutdown().await;

    let seen = seen.lock().unwrap().clone();
    let got = &seen[&child];
    assert_eq!(got.len(), 3, "{got:?}");
    assert_eq!(got[&p1], ParentResult::Result(serde_json::json!({"n": 1})));
    assert_eq!(got[&p2], ParentResult::Result(serde_json::json!("two")));
    match &got[&pf] {
        ParentResult::Error(e) => assert!(e.contains("the parent broke"), "{e}"),
        other => panic!("the dead parent gave {other:?}"),
    }
    let got = &seen[&capped];
    assert!(
        got[&b1] == ParentResult::Result(serde_json::json!(big)),
        "the first big result is received whole: {}",
        brief(&got[&b1])
    );
    assert!(
        got[&b2] == ParentResult::Omitted { bytes: 700_002 },
        "the second passes the cap and is omitted with its size: {}",
        brief(&got[&b2])
    );
    let history: i64 = db.scalar("SELECT count(*) FROM pgwake.finished_jobs").await;
    assert_eq!(
        history, 0,
        "history is off: the results came from the edges"
    );
}

/// A result in a few words (a big one is not printed whole).
fn brief(r: &ParentResult) -> String {
    let text = format!("{r:?}");
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}… ({} bytes)", &text[..at], text.len()),
        None => text,
    }
}

#[tokio::test]
async fn tx_mode_children_read_their_parents_results() {
    children_read_their_parents_results(false).await;
}

#[tokio::test]
async fn lease_mode_children_read_their_parents_results() {
    children_read_their_parents_results(true).await;
}

/// A `sql` handler's function that takes the job's id reads its parents'
/// results with `pgwake.parent_results(job_id)`; one parent is a Rust
/// handler, the other a `sql` function whose value is its result. History
/// off. (With the worker's edge write switched off, `seen` holds
/// `{"result": null}` for both and this fails.)
async fn a_sql_child_reads_its_parents_results(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE seen (job_id bigint, results jsonb);
             CREATE FUNCTION sql_parent(payload jsonb) RETURNS jsonb
             LANGUAGE sql AS $$ SELECT jsonb_build_object('from', 'sql') $$;
             CREATE FUNCTION sql_child(payload jsonb, job_id bigint, attempt int) RETURNS void
             LANGUAGE sql AS $$ INSERT INTO seen VALUES (job_id, pgwake.parent_results(job_id)) $$;",
        )
        .await
        .unwrap();
    let rust = enqueue(
        &client,
        &NewJob::new("produce", serde_json::json!({"value": {"from": "rust"}})),
    )
    .await
    .unwrap();
    let sql = enqueue(&client, &NewJob::new("sql_parent", serde_json::json!({})))
        .await
        .unwrap();
    let child = enqueue(
        &client,
        &NewJob::new("sql_child", serde_json::json!({})).after([rust, sql]),
    )
    .await
    .unwrap();
    let config = WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        ..test_config()
    };
    let seen: Seen = Default::default();
    let mut builder = Worker::builder(db.config())
        .config(config)
        .handler("produce", Flow { seen });
    for flag in ["sql_parent=sql:sql_parent", "sql_child=sql:sql_child"] {
        let (task, h) = pgwake::handlers::parse_flag_with(flag, 1024).unwrap();
        builder = builder.handler_arc(&task, h);
    }
    let worker = Running::start(builder.build().unwrap());
    wait_for(
        "the sql child to run",
        Duration::from_secs(60),
        async || {
            let n: i64 = db.scalar("SELECT count(*) FROM seen").await;
            if n == 1 {
                Ok(())
            } else {
                Err("not yet".into())
            }
        },
    )
    .await;
    worker.shutdown().await;
    let row = client
        .query_one("SELECT job_id, results FROM seen", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), child);
    assert_eq!(
        row.get::<_, serde_json::Value>(1),
        serde_json::json!({
            rust.to_string(): {"result": {"from": "rust"}},
            sql.to_string(): {"result": {"from": "sql"}},
        })
    );
}

#[tokio::test]
async fn tx_mode_a_sql_child_reads_its_parents_results() {
    a_sql_child_reads_its_parents_results(false).await;
}

#[tokio::test]
async fn lease_mode_a_sql_child_reads_its_parents_results() {
    a_sql_child_reads_its_parents_results(true).await;
}
