//! Hostile input: odd queue names, SQL-looking task names, extreme run_at,
//! unusual payloads. All handled, nothing lost, clear errors where refused.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, enqueue_many, NewJob};
use pgwake::{Worker, WorkerConfig};

const QUEUES: &[&str] = &[
    "it's \"quoted\"",
    "with spaces and ; semicolons",
    "ünïcødé 队列 🚀",
    "'); DROP TABLE pgwake.jobs; --",
    "$1",
];

#[tokio::test]
async fn queue_names_with_quotes_spaces_and_unicode_are_data_not_sql() {
    let db = migrated_db().await;
    register_waiter(&db).await;
    let mut n = Notifications::listen(&db).await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for q in QUEUES {
        ids.push(
            enqueue(&client, &NewJob::new("t", serde_json::json!({})).queue(*q))
                .await
                .unwrap(),
        );
    }
    client
        .execute("SELECT pg_notify($1, 'm')", &[&MARKER])
        .await
        .unwrap();
    let mut got = n.until_marker("m").await;
    got.sort();
    let mut want: Vec<String> = QUEUES.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(
        got, want,
        "each queue name arrives intact as the NOTIFY payload"
    );
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(QUEUES.iter().map(|s| s.to_string()).collect()),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let evs = w
        .next_events(QUEUES.len(), Duration::from_secs(30), |_| true)
        .await;
    w.shutdown().await;
    assert!(evs.iter().all(|e| e.outcome() == "done"));
    assert_eq!(ledger.check(&ids), vec![]);
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn invalid_queue_and_task_names_are_refused_with_a_clear_error() {
    let db = migrated_db().await;
    let client = db.client().await;
    let long = "q".repeat(129);
    for (job, expect) in [
        (
            NewJob::new("t", serde_json::json!({})).queue(long.as_str()),
            "longer than 128 bytes",
        ),
        (
            NewJob::new("t", serde_json::json!({})).queue(""),
            "queue name is empty",
        ),
        (
            NewJob::new("t", serde_json::json!({})).queue("a\nb"),
            "control characters",
        ),
        (
            NewJob::new("", serde_json::json!({})),
            "task must not be empty",
        ),
        (
            NewJob::new("t", serde_json::json!({})).max_attempts(0),
            "max_attempts must be at least 1",
        ),
    ] {
        let err = enqueue(&client, &job).await.unwrap_err().to_string();
        assert!(err.contains(expect), "{err}");
    }
    // The database refuses what bypasses the client, too.
    let err = client
        .execute(
            "INSERT INTO pgwake.jobs (task, queue) VALUES ('t', $1)",
            &[&long],
        )
        .await
        .unwrap_err();
    assert!(err
        .as_db_error()
        .unwrap()
        .message()
        .contains("jobs_queue_valid"));
    assert_eq!(remaining(&db).await, 0);
    let cfg = WorkerConfig {
        queues: Some(vec!["x\u{0}y".into()]),
        ..test_config()
    };
    assert!(cfg.validate().unwrap_err().to_string().contains("--queues"));
}

#[tokio::test]
async fn unusual_payloads_round_trip_unchanged() {
    let db = migrated_db().await;
    let client = db.client().await;
    let nest = |levels: usize| {
        let mut v = serde_json::json!("bottom");
        for _ in 0..levels {
            v = serde_json::json!({ "d": v });
        }
        v
    };
    let deep = nest(100);
    let payloads = vec![
        serde_json::Value::Null,
        serde_json::json!([1, "two", null, [3.5, {"x": false}]]),
        serde_json::json!("just a string with 'quotes' and \"doubles\" and \\u0000 spelled out"),
        serde_json::json!(12345678901234i64),
        serde_json::json!({"sql": "'); DROP TABLE pgwake.jobs; --", "emoji": "🚀", "empty": {}}),
        deep,
        serde_json::json!({"blob": "x".repeat((1 << 20) - 64)}),
    ];
    // PostgreSQL's jsonb cannot hold a NUL character: refused before the
    // database, naming the fix, and nothing of that batch is inserted.
    let nul = enqueue_many(
        &client,
        &[
            NewJob::new("echo", serde_json::json!("ok")),
            NewJob::new("echo", serde_json::json!("a\u{0000}b")),
        ],
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        nul.contains("job 2: payload holds the character U+0000") && nul.contains("base64"),
        "{nul}"
    );
    assert_eq!(remaining(&db).await, 0);
    let jobs: Vec<NewJob> = payloads
        .iter()
        .map(|p| NewJob::new("echo", p.clone()))
        .collect();
    let ids = enqueue_many(&client, &jobs).await.unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s = seen.clone();
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler(
            "echo",
            Recording {
                ledger: Ledger::default(),
                behaviour: move |job: &pgwake::Job| {
                    s.lock().unwrap().push((job.id, job.payload.clone()));
                    Ok(pgwake::Outcome::Done)
                },
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.next_events(payloads.len(), Duration::from_secs(30), |_| true)
        .await;
    w.shutdown().await;
    let seen = seen.lock().unwrap();
    for (id, payload) in ids.iter().zip(&payloads) {
        let got = &seen.iter().find(|(i, _)| i == id).unwrap().1;
        assert_eq!(got, payload);
    }
}

/// A job whose `run_at` is `text` as the producer wrote it.
fn run_at_text(text: &str) -> NewJob {
    let mut job = NewJob::new("t", serde_json::json!({}));
    job.run_at = Some(text.into());
    job
}

#[tokio::test]
async fn run_at_far_in_the_past_runs_now_and_far_in_the_future_never_early() {
    let db = migrated_db().await;
    let client = db.client().await;
    let past = enqueue(&client, &run_at_text("1970-01-01T00:00:00Z"))
        .await
        .unwrap();
    let future = enqueue(&client, &run_at_text("9999-12-31T00:00:00Z"))
        .await
        .unwrap();
    let forever = enqueue(&client, &run_at_text("infinity")).await.unwrap();
    let bad = enqueue(&client, &run_at_text("next tuesday-ish"))
        .await
        .unwrap_err()
        .to_string();
    assert!(bad.contains("timestamp"), "{bad}");
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            poll_interval: Duration::from_millis(100),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].id, past);
    // Many polls later the future ones are still waiting.
    let polls_before = ledger.runs().len();
    let marker = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].id, marker);
    w.shutdown().await;
    assert_eq!(polls_before, 1);
    let waiting: Vec<i64> = client
        .query("SELECT id FROM pgwake.jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(waiting, vec![future, forever]);
}

#[tokio::test]
async fn a_payload_nested_too_deep_to_decode_goes_dead_intact_and_the_worker_carries_on() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Built in SQL: 1,000 levels, beyond what the worker decodes.
    let id: i64 = client
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload) VALUES ('t', (repeat('{\"d\":', 1000) || '1' || repeat('}', 1000))::jsonb) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!((ev[0].id, ev[0].outcome()), (id, "dead"));
    assert!(
        ev[0].error().unwrap().contains("payload cannot be decoded"),
        "{:?}",
        ev[0].error()
    );
    // The worker still works.
    let next = insert_jobs(&db, "t", 1).await[0];
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!((ev[0].id, ev[0].outcome()), (next, "done"));
    w.shutdown().await;
    let depth_kept: bool = client
        .query_one("SELECT payload #> '{d,d,d,d,d,d,d,d,d,d}' IS NOT NULL FROM pgwake.dead_jobs WHERE id = $1", &[&id])
        .await
        .unwrap()
        .get(0);
    assert!(depth_kept, "the payload is kept intact in dead_jobs");
}
