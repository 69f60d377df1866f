//! Ordinary jobs through the reference workers: results exactly as the
//! process gave them, failures for good and retries after a delay, what a
//! process prints, and SQL in the claim transaction.

use crate::common::*;
use crate::support::*;

use pgwake::client::{enqueue, NewJob};
use serde_json::json;

/// Payloads with what breaks naive code: odd bytes, deep-ish nesting,
/// quotes and newlines, and (`big`) an integer past 2^64, which Python
/// keeps exactly and JavaScript's `JSON.parse` rounds (the process's
/// language decides; pgwake passes every digit).
fn odd_payloads(big: bool) -> Vec<serde_json::Value> {
    let mut v = vec![
        json!({"n": 1, "max": 9007199254740991_i64}),
        json!({"s": "quote \" backslash \\ newline \n tab \t nul-ish \u{1} bidi \u{202e} emoji 🦀"}),
        json!([[[[[[[[[[{"deep": true}]]]]]]]]]]),
        json!("just a string"),
    ];
    if big {
        v.push(serde_json::from_str(r#"{"big": 123456789012345678901234567890}"#).unwrap());
    }
    v
}

async fn results_come_back_exactly(command: String, big: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for p in odd_payloads(big) {
        ids.push(enqueue(&client, &NewJob::new("echo", p)).await.unwrap());
    }
    let mut w = Running::start(worker(
        &db,
        &command,
        &["echo"],
        &[],
        options(2),
        history_config(),
    ));
    let ev = w.next_events(ids.len(), WAIT, |_| true).await;
    w.shutdown().await;
    assert!(ev.iter().all(|e| e.outcome() == "done"), "{ev:?}");
    for (id, payload) in ids.iter().zip(odd_payloads(big)) {
        let (outcome, attempts, result, _) = finished(&db, *id).await;
        assert_eq!((outcome.as_str(), attempts), ("done", 1));
        // jsonb round trip: compare as PostgreSQL stores the payload.
        let stored: String = db
            .scalar(&format!(
                "SELECT (payload)::text FROM pgwake.finished_jobs WHERE id = {id}"
            ))
            .await;
        let result_text: String = db
            .scalar(&format!(
                "SELECT (result)::text FROM pgwake.finished_jobs WHERE id = {id}"
            ))
            .await;
        assert_eq!(
            result_text, stored,
            "payload {payload} came back changed: {result:?}"
        );
    }
}

#[tokio::test]
async fn python_results_come_back_exactly_as_the_payload_went() {
    results_come_back_exactly(python_worker(""), true).await;
}

#[tokio::test]
async fn node_results_come_back_exactly_as_the_payload_went() {
    results_come_back_exactly(node_worker(""), false).await;
}

#[tokio::test]
async fn fail_for_good_is_dead_at_once_and_retry_after_waits_the_given_delay() {
    let db = migrated_db().await;
    let client = db.client().await;
    let dead = enqueue(
        &client,
        &NewJob::new("fail", json!({"error": "no such image", "for_good": true})),
    )
    .await
    .unwrap();
    let later = enqueue(
        &client,
        &NewJob::new(
            "fail",
            json!({"error": "rate limited", "retry_after": 3600}),
        ),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker(
        &db,
        &python_worker(""),
        &["fail"],
        &[],
        options(1),
        history_config(),
    ));
    let ev = w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    let by_id = |id| ev.iter().find(|e| e.id == id).unwrap().outcome();
    assert_eq!((by_id(dead), by_id(later)), ("dead", "retry"), "{ev:?}");
    assert_eq!(dead_reason(&client, dead).await, "no such image");
    let row = client
        .query_one(
            "SELECT extract(epoch FROM run_at - now())::float8, attempts, last_error FROM pgwake.jobs WHERE id = $1",
            &[&later],
        )
        .await
        .unwrap();
    let (delay, attempts, error): (f64, i32, String) = (row.get(0), row.get(1), row.get(2));
    assert!(delay > 3000.0 && delay <= 3600.0, "due in {delay} s");
    assert_eq!((attempts, error.as_str()), (1, "rate limited"));
}

/// A `snooze` message puts the job back for its `after` seconds with no
/// attempt used, and counts the snooze; a snooze past the bound is a
/// failed attempt naming it.
async fn a_snooze_message_snoozes_without_using_an_attempt(command: &str) {
    let db = migrated_db().await;
    let client = db.client().await;
    let nap = enqueue(&client, &NewJob::new("snooze", json!({"secs": 3600})))
        .await
        .unwrap();
    let long = enqueue(
        &client,
        &NewJob::new("snooze", json!({"secs": 40 * 86_400})),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker(
        &db,
        command,
        &["snooze"],
        &[],
        options(1),
        history_config(),
    ));
    let ev = w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    let by_id = |id| ev.iter().find(|e| e.id == id).unwrap().outcome();
    assert_eq!((by_id(nap), by_id(long)), ("snoozed", "retry"), "{ev:?}");
    let row = client
        .query_one(
            "SELECT extract(epoch FROM run_at - now())::float8, attempts, \
                    (SELECT snoozes FROM pgwake.job_snoozes WHERE job_id = j.id) \
             FROM pgwake.jobs j WHERE id = $1",
            &[&nap],
        )
        .await
        .unwrap();
    let (delay, attempts, snoozes): (f64, i32, Option<i32>) = (row.get(0), row.get(1), row.get(2));
    assert!(delay > 3000.0 && delay <= 3600.0, "due in {delay} s");
    assert_eq!((attempts, snoozes), (0, Some(1)));
    let error = ev
        .iter()
        .find(|e| e.id == long)
        .unwrap()
        .error()
        .unwrap_or_default()
        .to_string();
    assert!(error.contains("longer than the longest snooze"), "{error}");
}

#[tokio::test]
async fn python_a_snooze_message_snoozes_without_using_an_attempt() {
    a_snooze_message_snoozes_without_using_an_attempt(&python_worker("")).await;
}

#[tokio::test]
async fn node_a_snooze_message_snoozes_without_using_an_attempt() {
    a_snooze_message_snoozes_without_using_an_attempt(&node_worker("")).await;
}

#[tokio::test]
async fn sql_from_the_process_commits_with_its_job_and_rolls_back_with_its_failure() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute("CREATE TABLE public.orders (id int PRIMARY KEY, note text)")
        .await
        .unwrap();
    let insert = |id: i64, fail: bool| {
        NewJob::new(
            "sql",
            json!({
                "statements": [
                    {"sql": "INSERT INTO public.orders VALUES ($1, $2) RETURNING id, note", "params": [id, "n-" .to_string() + &id.to_string()]},
                    {"sql": "SELECT count(*)::int AS n FROM public.orders WHERE id = $1", "params": [id]}
                ],
                "fail": fail
            }),
        )
        .max_attempts(1)
    };
    let good = enqueue(&client, &insert(1, false)).await.unwrap();
    let bad = enqueue(&client, &insert(2, true)).await.unwrap();
    let mut w = Running::start(worker(
        &db,
        &python_worker(""),
        &["sql"],
        &["sql"],
        options(1),
        history_config(),
    ));
    let ev = w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    let by_id = |id| ev.iter().find(|e| e.id == id).unwrap().outcome();
    assert_eq!((by_id(good), by_id(bad)), ("done", "dead"), "{ev:?}");
    let rows: Vec<i32> = client
        .query("SELECT id FROM public.orders ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        rows,
        vec![1],
        "the failed job's insert is rolled back with it"
    );
    let (_, _, result, _) = finished(&db, good).await;
    assert_eq!(
        result.unwrap(),
        json!([
            {"rows": [{"id": 1, "note": "n-1"}], "rows_affected": 1},
            {"rows": [{"n": 1}], "rows_affected": 1}
        ]),
        "the process saw its own insert inside the transaction"
    );
}

#[tokio::test]
async fn sql_for_a_lease_job_is_refused_with_a_reason() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("sql", json!({"statements": [{"sql": "SELECT 1 AS one"}]})).max_attempts(1),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker(
        &db,
        &python_worker(""),
        &["sql"],
        &[],
        options(1),
        test_config(),
    ));
    let ev = w.next_events(1, WAIT, |_| true).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "dead");
    let reason = dead_reason(&client, id).await;
    assert!(reason.contains("tx mode"), "{reason}");
}

#[tokio::test]
async fn the_job_message_carries_the_jobs_keys() {
    let db = migrated_db().await;
    let client = db.client().await;
    let keyed = enqueue(
        &client,
        &NewJob::new("pid", json!({}))
            .ordering_key("customer:42")
            .unique_key("invoice \"7\"")
            .limit_key("tenant-ü"),
    )
    .await
    .unwrap();
    let bare = enqueue(&client, &NewJob::new("pid", json!({})))
        .await
        .unwrap();
    let mut w = Running::start(worker(
        &db,
        &quirky(""),
        &["pid"],
        &[],
        options(1),
        history_config(),
    ));
    w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    let (_, _, result, _) = finished(&db, keyed).await;
    assert_eq!(
        result.unwrap()["keys"],
        json!({"ordering": "customer:42", "unique": "invoice \"7\"", "limit": "tenant-ü"})
    );
    let (_, _, result, _) = finished(&db, bare).await;
    assert_eq!(
        result.unwrap()["keys"],
        json!({"ordering": null, "unique": null, "limit": null})
    );
}

/// A real Python process gets the job's trace context in the job message
/// when the worker traces jobs (the producer's, without an exporter), and
/// an untraced job's message has none.
#[tokio::test]
async fn the_job_message_carries_the_trace_context_when_the_worker_traces_jobs() {
    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let db = migrated_db().await;
    let client = db.client().await;
    let traced = enqueue(&client, &NewJob::new("pid", json!({})).traceparent(TP))
        .await
        .unwrap();
    let bare = enqueue(&client, &NewJob::new("pid", json!({})))
        .await
        .unwrap();
    let mut config = history_config();
    // Teeth: without it, no context reaches the process.
    config.trace_jobs = true;
    let mut w = Running::start(worker(&db, &quirky(""), &["pid"], &[], options(1), config));
    w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    let (_, _, result, _) = finished(&db, traced).await;
    assert_eq!(result.unwrap()["traceparent"], TP);
    let (_, _, result, _) = finished(&db, bare).await;
    assert_eq!(result.unwrap()["traceparent"], serde_json::Value::Null);
}

/// A `progress` message of a real Python or Node process is shown while
/// its job runs (in both modes), a value over the bound is refused and the
/// job goes on (done); the running job, cancelled, leaves no row. With
/// the message ignored nothing is shown.
async fn a_progress_message_is_shown_while_the_job_runs(command: &str, tx: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let long = enqueue(
        &client,
        &NewJob::new(
            "progress",
            json!({"value": {"done": 2, "of": 3}, "message": "two <b>of</b> three", "secs": 3600}),
        ),
    )
    .await
    .unwrap();
    let big = enqueue(
        &client,
        &NewJob::new(
            "progress",
            json!({"value": "x".repeat(pgwake::PROGRESS_VALUE_MAX + 1), "secs": 0}),
        ),
    )
    .await
    .unwrap();
    let mut config = test_config();
    config.progress_interval = std::time::Duration::from_millis(50);
    let tx_tasks: &[&str] = if tx { &["progress"] } else { &[] };
    let mut w = Running::start(worker(
        &db,
        command,
        &["progress"],
        tx_tasks,
        options(1),
        config,
    ));
    let ev = w.next_events(1, WAIT, |e| e.id == big).await;
    assert_eq!(
        ev[0].outcome(),
        "done",
        "an over-bound report is refused, the job goes on"
    );
    let p = wait_for(
        "the job's progress",
        WAIT,
        async || match pgwake::admin::jobs::show(&client, long)
            .await
            .unwrap()
            .unwrap()
            .progress
        {
            Some(p) => Ok(p),
            None => Err("none".into()),
        },
    )
    .await;
    assert_eq!(
        (p.value.as_str(), p.message.as_deref()),
        (r#"{"of": 3, "done": 2}"#, Some("two <b>of</b> three"))
    );
    pgwake::cancel(&client, long).await.unwrap();
    w.next_events(1, WAIT, |e| e.id == long).await;
    eventually("the run's row to go", WAIT, || async {
        let n: i64 = db.scalar("SELECT count(*) FROM pgwake.job_progress").await;
        n == 0
    })
    .await;
    w.shutdown().await;
}

#[tokio::test]
async fn python_a_progress_message_is_shown_while_the_job_runs_lease_mode() {
    a_progress_message_is_shown_while_the_job_runs(&python_worker("--inflight 2"), false).await;
}

#[tokio::test]
async fn node_a_progress_message_is_shown_while_the_job_runs_tx_mode() {
    a_progress_message_is_shown_while_the_job_runs(&node_worker("--inflight 2"), true).await;
}
