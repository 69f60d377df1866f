//! A job's W3C trace context (issue 39, item 1): it reaches the job from
//! `SET LOCAL pgwake.traceparent` around plain INSERTs, from
//! `pgwake.enqueue`'s argument, the Rust client, the CLI and NDJSON; it is
//! kept through retries, death, `dead retry` and history in both delivery
//! modes, and swept once the job is gone; a malformed one never fails an
//! insert: it is ignored and counted.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, enqueue_many_detailed, NewJob};
use pgwake::{Outcome, Worker, WorkerConfig};

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TP2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// Job `id`'s recorded (traceparent, tracestate), if any.
async fn trace_of(client: &tokio_postgres::Client, id: i64) -> Option<(String, Option<String>)> {
    client
        .query_opt(
            "SELECT traceparent, tracestate FROM pgwake.job_traces WHERE job_id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

/// How many malformed contexts the database has counted.
async fn rejected(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM pgwake.trace_context_rejected",
    )
    .await
}

/// Every job a transaction inserts after `SET LOCAL pgwake.traceparent`
/// gets it (a plain INSERT of two rows, pgwake.enqueue), with its
/// tracestate; a job inserted by the next transaction on the same session
/// gets none. (With the insert trigger jobs_trace_context's WHEN clause
/// false, the first assertion fails: no job has a context; so does the
/// enqueue argument's test, which goes through the trigger.)
#[tokio::test]
async fn set_local_gives_the_context_to_every_job_of_the_transaction() {
    let db = migrated_db().await;
    let client = db.client().await;
    let rows = client
        .simple_query(&format!(
            "BEGIN;
             SET LOCAL pgwake.traceparent = '{TP}';
             SET LOCAL pgwake.tracestate = 'congo=t61rcWkgMzE';
             INSERT INTO pgwake.jobs (task) VALUES ('a'), ('b');
             SELECT pgwake.enqueue('c');
             COMMIT;
             INSERT INTO pgwake.jobs (task) VALUES ('after');"
        ))
        .await
        .unwrap();
    drop(rows);
    let ids: Vec<(i64, String)> = client
        .query("SELECT id, task FROM pgwake.jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(ids.len(), 4);
    for (id, task) in &ids {
        let want = (task != "after").then(|| (TP.to_string(), Some("congo=t61rcWkgMzE".into())));
        assert_eq!(trace_of(&client, *id).await, want, "job {id} ({task})");
    }
    assert_eq!(rejected(&db).await, 0);
}

/// `pgwake.enqueue(traceparent => …)` gives this job its context even in a
/// transaction that set another, and puts the transaction's back for the
/// inserts after it. The Rust client's NewJob::traceparent likewise wins
/// over the transaction's; a duplicate of a waiting unique job changes
/// nothing of the waiting job's context.
#[tokio::test]
async fn the_enqueue_argument_and_the_rust_client_give_a_job_its_own_context() {
    let db = migrated_db().await;
    let mut client = db.client().await;
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&format!("SET LOCAL pgwake.traceparent = '{TP}'"))
        .await
        .unwrap();
    let own: i64 = tx
        .query_one(
            "SELECT pgwake.enqueue('t', traceparent => $1, tracestate => 'k=v')",
            &[&TP2],
        )
        .await
        .unwrap()
        .get(0);
    let after: i64 = tx
        .query_one(
            "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let from_client = enqueue(
        &tx,
        &NewJob::new("t", serde_json::json!({})).traceparent(TP2),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        trace_of(&client, own).await,
        Some((TP2.into(), Some("k=v".into())))
    );
    assert_eq!(trace_of(&client, after).await, Some((TP.into(), None)));
    assert_eq!(
        trace_of(&client, from_client).await,
        Some((TP2.into(), None))
    );

    let first = enqueue_many_detailed(
        &client,
        &[
            NewJob::new("t", serde_json::json!({}))
                .unique_key("u")
                .traceparent(TP),
            NewJob::new("t", serde_json::json!({}))
                .unique_key("u")
                .traceparent(TP2),
        ],
    )
    .await
    .unwrap();
    assert!(first[1].duplicate);
    assert_eq!(
        trace_of(&client, first[0].id).await,
        Some((TP.into(), None))
    );
}

/// `pgwake enqueue --traceparent` and NDJSON lines (their own field, or the
/// command's $TRACEPARENT for lines without one), and `pgwake job show`
/// prints the trace id.
#[tokio::test]
async fn the_cli_and_ndjson_take_a_trace_context() {
    let db = migrated_db().await;
    let url = db.url.clone();
    let out = run_pgwake(
        &[
            "enqueue",
            "--task",
            "t",
            "--traceparent",
            TP,
            "--tracestate",
            "a=1",
        ],
        Some(&url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let id: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let client = db.client().await;
    assert_eq!(
        trace_of(&client, id).await,
        Some((TP.into(), Some("a=1".into())))
    );

    let out = pgwake_cmd()
        .env("DATABASE_URL", &url)
        .env("TRACEPARENT", TP2)
        .args(["enqueue", "--ndjson"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(
                format!("{{\"task\": \"own\", \"traceparent\": \"{TP}\"}}\n{{\"task\": \"inherits\"}}\n")
                    .as_bytes(),
            )?;
            child.wait_with_output()
        })
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let traces: Vec<(String, String)> = client
        .query(
            "SELECT j.task, t.traceparent FROM pgwake.jobs j JOIN pgwake.job_traces t ON t.job_id = j.id
             WHERE j.task IN ('own', 'inherits') ORDER BY j.task",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        traces,
        vec![("inherits".into(), TP2.into()), ("own".into(), TP.into())]
    );

    let shown = run_pgwake(&["job", "show", &id.to_string()], Some(&url));
    assert!(shown.status.success(), "{}", stderr_of(&shown));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("trace      4bf92f3577b34da6a3ce929d0e0e4736") && text.contains("a=1"),
        "{text}"
    );
}

/// Malformed values never fail an insert, whichever way they come: the
/// job is enqueued without a context (a bad tracestate alone is dropped,
/// its traceparent kept), each is counted once, and the worker's sampler
/// publishes the count. (With the check in pgwake.trace_job removed, the
/// Rust client's enqueue of a value of the wrong length fails on job_traces' length
/// constraint.)
#[tokio::test]
async fn malformed_trace_contexts_are_ignored_and_counted_never_a_failed_insert() {
    let db = migrated_db().await;
    let client = db.client().await;
    let long = "0".repeat(10 * 1024);
    let bad = [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", // wrong length
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01", // bad hex
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", // uppercase
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // version ff
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", // separators
        long.as_str(),                                            // 10 KB
    ];
    let mut ids = Vec::new();
    for value in bad {
        // SET LOCAL around a plain INSERT …
        let mut c = db.client().await;
        let tx = c.transaction().await.unwrap();
        tx.execute(
            "SELECT set_config('pgwake.traceparent', $1, true)",
            &[&value],
        )
        .await
        .unwrap();
        let id: i64 = tx
            .query_one(
                "INSERT INTO pgwake.jobs (task) VALUES ('t') RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        tx.commit().await.unwrap();
        ids.push(id);
        // … pgwake.enqueue's argument, and the Rust client.
        let id: i64 = client
            .query_one("SELECT pgwake.enqueue('t', traceparent => $1)", &[&value])
            .await
            .unwrap()
            .get(0);
        ids.push(id);
        ids.push(
            enqueue(
                &client,
                &NewJob::new("t", serde_json::json!({})).traceparent(value),
            )
            .await
            .unwrap(),
        );
    }
    // U+0000, which PostgreSQL text cannot hold: counted, not an error.
    ids.push(
        enqueue(
            &client,
            &NewJob::new("t", serde_json::json!({})).traceparent(format!("{}\0", &TP[..54])),
        )
        .await
        .unwrap(),
    );
    for id in &ids {
        assert_eq!(trace_of(&client, *id).await, None, "job {id}");
    }
    let expected = (bad.len() * 3 + 1) as i64;
    assert_eq!(rejected(&db).await, expected);

    // A bad tracestate (over 512 bytes, a control character) is dropped and
    // counted; the traceparent stays.
    for state in ["k=".to_string() + &"v".repeat(511), "k=v\u{1}".into()] {
        let id = enqueue(
            &client,
            &NewJob::new("t", serde_json::json!({}))
                .traceparent(TP)
                .tracestate(state),
        )
        .await
        .unwrap();
        assert_eq!(trace_of(&client, id).await, Some((TP.into(), None)));
    }
    assert_eq!(rejected(&db).await, expected + 2);

    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let sample = pgwake::admin::gauges::sample(&pool, 1000).await.unwrap();
    assert_eq!(sample.trace_context_rejected, expected + 2);
}

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

/// A traced job that fails twice (retried once, then dead), is retried
/// from the dead jobs, and is done: its context is there at every step,
/// in `pgwake job show` and beside its history rows; history maintenance
/// keeps it while the history has the job, and sweeps it (and a stray
/// one) once the history has not. (With the sweep's history check
/// removed, the first round sweeps the done job's context too: 2 swept,
/// not 1.)
async fn a_context_is_kept_through_retries_death_dead_retry_and_history(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    pgwake::admin::history::apply(
        &client,
        pgwake::config::KeepFinished::Keep(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let id = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({}))
            .max_attempts(2)
            .traceparent(TP),
    )
    .await
    .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(config(lease))
        .handler(
            "t",
            Recording {
                ledger: ledger.clone(),
                behaviour: move |_: &pgwake::Job| {
                    if counted.fetch_add(1, Ordering::SeqCst) < 2 {
                        Err("fails twice".into())
                    } else {
                        Ok(Outcome::Done)
                    }
                },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w.next_events(2, Duration::from_secs(30), |_| true).await;
    assert_eq!(events[1].outcome(), "dead", "{events:?}");
    assert_eq!(trace_of(&client, id).await, Some((TP.into(), None)), "dead");
    let shown = pgwake::admin::jobs::show(&client, id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shown.job.as_ref().map(|j| j.state.as_str()), Some("dead"));
    assert_eq!(
        shown.trace.as_ref().map(|t| t.trace_id()),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    let revived = pgwake::admin::dead::retry(
        &client,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![id]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(revived, vec![id]);
    let done = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(done[0].outcome(), "done", "{done:?}");
    w.shutdown().await;
    assert_eq!(trace_of(&client, id).await, Some((TP.into(), None)), "done");

    // Kept while the history holds the job; a stray context is swept.
    client
        .execute("SELECT pgwake.trace_job(-7, $1, NULL)", &[&TP2])
        .await
        .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let maintenance =
        pgwake::internal::Maintenance::new(pool, pgwake::config::HistoryConfig::default());
    let report = maintenance.run_once().await.unwrap();
    assert_eq!(report.traces_swept, 1, "{report:?}");
    assert_eq!(trace_of(&client, id).await, Some((TP.into(), None)));
    // Out of the history (as when its partition is dropped): swept.
    client
        .execute("DELETE FROM pgwake.finished_jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    let report = maintenance.run_once().await.unwrap();
    assert_eq!(report.traces_swept, 1, "{report:?}");
    assert_eq!(trace_of(&client, id).await, None);
}

#[tokio::test]
async fn tx_mode_a_context_is_kept_through_retries_death_dead_retry_and_history() {
    a_context_is_kept_through_retries_death_dead_retry_and_history(false).await;
}

#[tokio::test]
async fn lease_mode_a_context_is_kept_through_retries_death_dead_retry_and_history() {
    a_context_is_kept_through_retries_death_dead_retry_and_history(true).await;
}
