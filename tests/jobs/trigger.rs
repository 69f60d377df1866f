//! The insert trigger's notifications: one per ready queue per statement,
//! none for future jobs, tiny whatever the payload.

use crate::common;

use common::*;

async fn mark(client: &tokio_postgres::Client, m: &str) {
    client
        .execute("SELECT pg_notify($1, $2)", &[&MARKER, &m])
        .await
        .unwrap();
}

#[tokio::test]
async fn one_notification_per_queue_per_statement_and_none_for_future_jobs() {
    let db = migrated_db().await;
    register_waiter(&db).await;
    let mut n = Notifications::listen(&db).await;
    let producer = db.client().await;
    // Two autocommit statements (two transactions, so nothing is folded).
    producer
        .execute(
            "INSERT INTO pgwake.jobs (task, queue) SELECT 't', 'a' FROM generate_series(1, 3)",
            &[],
        )
        .await
        .unwrap();
    producer
        .execute(
            "INSERT INTO pgwake.jobs (task, queue, run_at) VALUES
                 ('t', 'b', now()), ('t', 'b', now()), ('t', 'a', now()),
                 ('t', 'future', now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap();
    mark(&producer, "1").await;
    let mut got = n.until_marker("1").await;
    got.sort();
    // Statement 1: a. Statement 2: a and b once each, nothing for `future`.
    assert_eq!(got, vec!["a", "a", "b"]);

    // Only future rows: nothing at all.
    producer
        .batch_execute("INSERT INTO pgwake.jobs (task, queue, run_at) SELECT 't', 'later', now() + interval '1 day' FROM generate_series(1, 100)")
        .await
        .unwrap();
    mark(&producer, "2").await;
    assert!(n.until_marker("2").await.is_empty());
}

#[tokio::test]
async fn ten_thousand_rows_in_one_transaction_send_one_notification_per_queue() {
    let db = migrated_db().await;
    register_waiter(&db).await;
    let mut n = Notifications::listen(&db).await;
    let producer = db.client().await;
    producer
        .batch_execute(
            "BEGIN;
             INSERT INTO pgwake.jobs (task, queue) SELECT 't', 'q' || (g % 3) FROM generate_series(1, 5000) g;
             INSERT INTO pgwake.jobs (task, queue) SELECT 't', 'q' || (g % 3) FROM generate_series(1, 5000) g;
             COMMIT;",
        )
        .await
        .unwrap();
    mark(&producer, "m").await;
    let mut got = n.until_marker("m").await;
    got.sort();
    assert_eq!(got, vec!["q0", "q1", "q2"]);
}

#[tokio::test]
async fn notify_can_be_turned_off_for_bulk_loads() {
    let db = migrated_db().await;
    register_waiter(&db).await;
    let mut n = Notifications::listen(&db).await;
    let producer = db.client().await;
    producer
        .batch_execute(
            "BEGIN; SET LOCAL pgwake.notify = off;
             INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 1000);
             COMMIT;",
        )
        .await
        .unwrap();
    mark(&producer, "m").await;
    assert!(n.until_marker("m").await.is_empty());
    assert_eq!(
        remaining(&db).await,
        1000,
        "the rows are there; only the wake-up was skipped"
    );
}

#[tokio::test]
async fn a_megabyte_payload_never_travels_in_the_notification() {
    let db = migrated_db().await;
    register_waiter(&db).await;
    let mut n = Notifications::listen(&db).await;
    let producer = db.client().await;
    // Just under the bound on a new payload (1 MiB of JSON text, migration 0027).
    let big = serde_json::json!({"blob": "x".repeat((1 << 20) - 64)});
    let id = pgwake::client::enqueue(
        &producer,
        &pgwake::client::NewJob::new("big", big).queue("huge payloads"),
    )
    .await
    .unwrap();
    mark(&producer, "m").await;
    assert_eq!(n.until_marker("m").await, vec!["huge payloads"]);
    let len: i32 = producer
        .query_one(
            "SELECT octet_length(payload::text) FROM pgwake.jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert!(len > (1 << 20) - 64, "{len}");
}

#[tokio::test]
async fn with_no_worker_waiting_producers_send_no_notification() {
    let db = migrated_db().await;
    let mut n = Notifications::listen(&db).await;
    let producer = db.client().await;
    producer
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap();
    // An expired registration (a worker that died) does not count.
    producer
        .batch_execute("INSERT INTO pgwake.waiting_workers VALUES ('dead-worker', NULL, now() - interval '1 second')")
        .await
        .unwrap();
    producer
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap();
    // A waiter for another queue does not count either.
    producer
        .batch_execute(
            "INSERT INTO pgwake.waiting_workers VALUES ('other', ARRAY['other'], 'infinity')",
        )
        .await
        .unwrap();
    producer
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap();
    mark(&producer, "m").await;
    assert!(n.until_marker("m").await.is_empty());
    producer
        .execute(
            "INSERT INTO pgwake.jobs (task, queue) VALUES ('t', 'other')",
            &[],
        )
        .await
        .unwrap();
    mark(&producer, "m2").await;
    assert_eq!(n.until_marker("m2").await, vec!["other"]);
}
