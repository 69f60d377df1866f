//! The SQL API's own bounds on what a producer sends (issue 33, item 5): a
//! task name of at most 256 bytes and a payload of at most
//! `pgwake.producer_limits.payload_max_bytes` (1 MiB of JSON text by
//! default), checked by the table's insert trigger, so a plain `INSERT`,
//! `pgwake.enqueue`, the Rust client and `pgwake enqueue` all get the same
//! refusal: SQLSTATE 54000, a message naming the limit and a hint naming
//! the fix. Jobs stored before the bound still run and retry.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

/// 1 MiB, the default payload bound.
const MIB: usize = 1024 * 1024;

/// The server's refusal of `sql`: its SQLSTATE, message and hint.
async fn refusal(c: &tokio_postgres::Client, sql: &str) -> (String, String, String) {
    let e = c.execute(sql, &[]).await.unwrap_err();
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e:?}"));
    (
        db.code().code().to_string(),
        db.message().to_string(),
        db.hint().unwrap_or_default().to_string(),
    )
}

/// A 10 MB task name and a 2 MB payload are refused by a plain INSERT,
/// `pgwake.enqueue` (with and without a unique key), the Rust client and
/// the CLI, each naming the limit and the fix; a payload of exactly the
/// limit is taken; nothing else was enqueued.
#[tokio::test]
async fn a_huge_task_name_or_payload_is_refused_by_every_producer_naming_the_limit() {
    let db = migrated_db().await;
    let c = db.client().await;
    // JSON text of exactly `n` bytes: {"b": "xx…"} is 9 bytes besides the x's.
    let payload_sql = |n: usize| format!("jsonb_build_object('b', repeat('x', {}))", n - 9);

    for sql in [
        "INSERT INTO pgwake.jobs (task) VALUES (repeat('t', 10000000))".to_string(),
        "SELECT pgwake.enqueue(repeat('t', 10000000))".to_string(),
    ] {
        let (code, message, hint) = refusal(&c, &sql).await;
        assert_eq!(code, "54000", "{sql}: {message}");
        assert!(
            message.contains("10000000 bytes") && message.contains("at most 256"),
            "{sql}: {message}"
        );
        assert!(hint.contains("payload"), "{sql}: the fix: {hint}");
    }
    for sql in [
        format!(
            "INSERT INTO pgwake.jobs (task, payload) VALUES ('big', {})",
            payload_sql(2 * MIB)
        ),
        format!("SELECT pgwake.enqueue('big', {})", payload_sql(2 * MIB)),
        format!(
            "SELECT pgwake.enqueue('big', {}, unique_key => 'u')",
            payload_sql(2 * MIB)
        ),
        format!(
            "INSERT INTO pgwake.jobs (task, payload) SELECT 'big', {} FROM generate_series(1, 3)",
            payload_sql(MIB + 1)
        ),
    ] {
        let (code, message, hint) = refusal(&c, &sql).await;
        assert_eq!(code, "54000", "{sql}: {message}");
        assert!(
            message.contains("at most 1048576 bytes") && message.contains("big"),
            "{sql}: {message}"
        );
        assert!(
            hint.contains("pgwake.producer_limits") && hint.contains("payload_max_bytes"),
            "{sql}: the fix: {hint}"
        );
    }
    let n: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(n, 0, "nothing was enqueued");

    // The limit itself is taken, through every producer.
    c.execute(
        &format!(
            "INSERT INTO pgwake.jobs (task, payload) VALUES ('edge', {})",
            payload_sql(MIB)
        ),
        &[],
    )
    .await
    .unwrap();
    let size: i32 = db
        .scalar("SELECT octet_length(payload::text) FROM pgwake.jobs WHERE task = 'edge'")
        .await;
    assert_eq!(size as usize, MIB);

    // The Rust client: a usage error with the server's message and hint.
    let big = serde_json::json!({ "b": "x".repeat(2 * MIB) });
    let rust = enqueue(&c, &NewJob::new("big", big)).await.unwrap_err();
    assert!(rust.is_usage(), "{rust:?}");
    let said = rust.to_string();
    assert!(
        said.contains("at most 1048576 bytes") && said.contains("payload_max_bytes"),
        "{said}"
    );

    // The CLI: exit 2 with the same message (an argument holds at most
    // 128 KiB, so through --ndjson).
    let url = db.url.clone();
    let line =
        serde_json::json!({"task": "big", "payload": {"b": "x".repeat(2 * MIB)}}).to_string();
    let cli = tokio::task::spawn_blocking(move || {
        run_pgwake_stdin(&["enqueue", "--ndjson"], Some(&url), &line)
    })
    .await
    .unwrap();
    let err = stderr_of(&cli);
    assert_eq!(cli.status.code(), Some(2), "{err}");
    assert!(
        err.contains("at most 1048576 bytes") && err.contains("payload_max_bytes"),
        "{err}"
    );
    let n: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(n, 1, "only the job of exactly the limit");
}

/// The payload bound is a row of `pgwake.producer_limits`: lowered, a
/// payload above it is refused (the CLI says so too, exit 2) and one below
/// taken; raised, a bigger one is taken; a schedule's payload is held to
/// it, and it cannot be lowered below one; a setting outside 64 KiB–256
/// MiB is refused by the table.
#[tokio::test]
async fn the_payload_bound_is_a_setting() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.execute(
        "UPDATE pgwake.producer_limits SET payload_max_bytes = 65536",
        &[],
    )
    .await
    .unwrap();
    let (code, message, _) = refusal(
        &c,
        "SELECT pgwake.enqueue('t', jsonb_build_object('b', repeat('x', 70000)))",
    )
    .await;
    assert_eq!(code, "54000");
    assert!(message.contains("at most 65536 bytes"), "{message}");
    // What the trigger's cheap test (the datum over 8 KiB, or compressed)
    // must not miss: a payload whose text is six times its binary form
    // (12,000 control characters, 72,009 bytes as JSON text), and one
    // copied compressed from another table (100,000 x's: about 1 KiB).
    c.batch_execute(
        "CREATE TABLE src (p jsonb);
         INSERT INTO src SELECT jsonb_build_object('b', repeat('x', 100000));",
    )
    .await
    .unwrap();
    let stored: i32 = db.scalar("SELECT pg_column_size(p) FROM src").await;
    assert!(stored < 8192, "compressed in src: {stored} bytes");
    for sql in [
        "SELECT pgwake.enqueue('t', jsonb_build_object('b', repeat(chr(1), 12000)))",
        "INSERT INTO pgwake.jobs (task, payload) SELECT 't', p FROM src",
    ] {
        let (code, message, _) = refusal(&c, sql).await;
        assert_eq!(code, "54000", "{sql}: {message}");
        assert!(message.contains("at most 65536 bytes"), "{sql}: {message}");
    }
    let url = db.url.clone();
    let payload = serde_json::json!({ "b": "x".repeat(70_000) }).to_string();
    let cli = tokio::task::spawn_blocking(move || {
        run_pgwake(
            &["enqueue", "--task", "t", "--payload", &payload],
            Some(&url),
        )
    })
    .await
    .unwrap();
    assert_eq!(cli.status.code(), Some(2), "{}", stderr_of(&cli));
    assert!(
        stderr_of(&cli).contains("at most 65536 bytes"),
        "{}",
        stderr_of(&cli)
    );
    c.execute(
        "SELECT pgwake.enqueue('t', jsonb_build_object('b', repeat('x', 60000)))",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "UPDATE pgwake.producer_limits SET payload_max_bytes = 4194304",
        &[],
    )
    .await
    .unwrap();
    c.execute(
        "SELECT pgwake.enqueue('t', jsonb_build_object('b', repeat('x', 3000000)))",
        &[],
    )
    .await
    .unwrap();
    // Every tick of a schedule enqueues its payload: schedule_add refuses
    // one over the bound, and the bound cannot go below a schedule's.
    c.execute(
        "SELECT pgwake.schedule_add('nightly', '0 3 * * *', 't', jsonb_build_object('b', repeat('x', 3000000)))",
        &[],
    )
    .await
    .unwrap();
    let (code, message, hint) = refusal(
        &c,
        "UPDATE pgwake.producer_limits SET payload_max_bytes = 1048576",
    )
    .await;
    assert_eq!(code, "54000", "{message}");
    assert!(message.contains("\"nightly\""), "{message}");
    assert!(hint.contains("smaller payload"), "{hint}");
    let (code, message, _) = refusal(
        &c,
        "SELECT pgwake.schedule_add('huge', '0 3 * * *', 't', jsonb_build_object('b', repeat('x', 5000000)))",
    )
    .await;
    assert_eq!(code, "22023", "{message}");
    assert!(
        message.starts_with("payload:") && message.contains("at most 4194304 bytes"),
        "{message}"
    );
    for bad in ["1000", "1073741824"] {
        let e = c
            .execute(
                &format!("UPDATE pgwake.producer_limits SET payload_max_bytes = {bad}"),
                &[],
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.as_db_error().unwrap().constraint(),
            Some("producer_limits_payload_max_bytes_range"),
            "{bad}: {e:?}"
        );
    }
}

/// A schema upgraded with jobs above the bound already stored (a 2 MB
/// payload, before migration 0027): the migration succeeds, and the jobs
/// still run, fail once and are retried in both delivery modes (a retry
/// puts the row back into pgwake.jobs; the bound is for new jobs only).
#[tokio::test]
async fn jobs_stored_before_the_bound_still_migrate_run_and_retry() {
    // The tables of schema 26 (migrations only: today's functions/ may
    // name columns of later migrations), its jobs inserted plainly.
    let db = schema_at(26).await;
    let mut c = db.client().await;
    let mut ids = Vec::new();
    for task in ["big_exec", "big_sql"] {
        let id: i64 = c
            .query_one(
                "INSERT INTO pgwake.jobs (task, payload) \
                 VALUES ($1, jsonb_build_object('b', repeat('x', 2097152))) RETURNING id",
                &[&task],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    let report = pgwake::admin::schema::migrate(&mut c).await.unwrap();
    assert!(report.applied.contains(&27), "{:?}", report.applied);

    // Each fails its first attempt (a sequence: not rolled back with the
    // tx-mode attempt), then succeeds.
    let marker = tempfile::tempdir().unwrap();
    let flag = marker.path().join("tried");
    c.batch_execute(
        "CREATE SEQUENCE tries;
         CREATE FUNCTION flaky(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('tries') = 1 THEN RAISE EXCEPTION 'first attempt fails'; END IF;
         END $$;",
    )
    .await
    .unwrap();
    let exec = format!(
        "sh -c 'cat >/dev/null; test -e {0} && exit 0; touch {0}; exit 75'",
        flag.display()
    );
    let worker = pgwake::Worker::builder(db.config())
        .config(test_config())
        .handler(
            "big_exec",
            pgwake::handlers::exec::ExecHandler::parse(&exec).unwrap(),
        )
        .handler(
            "big_sql",
            pgwake::handlers::sql::SqlHandler::parse("flaky").unwrap(),
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w
        .next_events(4, Duration::from_secs(120), |e| ids.contains(&e.id))
        .await;
    for id in ids {
        let mine: Vec<_> = events.iter().filter(|e| e.id == id).collect();
        assert_eq!(mine.len(), 2, "job {id}: {events:?}");
        assert!(
            matches!(mine[0].resolution, pgwake::Resolution::Retry { .. }),
            "job {id}: {:?}",
            mine[0].resolution
        );
        assert_eq!(mine[1].resolution, pgwake::Resolution::Done, "job {id}");
    }
    w.shutdown().await;
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
}
