//! Bounds where a value meets the database: every entry point (CLI, SQL,
//! Rust) refuses a value the server or the claim cannot handle, with a
//! message naming the limit, and anything a producer named is printed
//! safely.
//!
//! - a job timeout above 24 days (the server's statement and idle limits
//!   are 32-bit milliseconds: 24.8 days) made a tx-mode job die "crashed"
//!   without running;
//! - `--max-running` had no upper bound (3,000,000 slot rows in one
//!   transaction);
//! - an ordering or unique key above ~2.7 KB failed with a raw index error;
//! - queue names with control characters passed a plain INSERT, and
//!   `pgwake stats` printed them raw (terminal escapes).

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

fn assert_refused(o: &std::process::Output, what: &str) {
    let err = stderr_of(o);
    assert_eq!(o.status.code(), Some(2), "{what}: {err}");
    assert!(
        !err.contains("index row size"),
        "{what}: a raw server error: {err}"
    );
}

#[tokio::test]
async fn a_timeout_above_24_days_is_refused_everywhere_and_24_days_runs() {
    let db = migrated_db().await;
    let c = db.client().await;
    let url = db.url.clone();
    let cli = tokio::task::spawn_blocking(move || {
        run_pgwake(&["enqueue", "--task", "t", "--timeout", "30d"], Some(&url))
    })
    .await
    .unwrap();
    assert_refused(&cli, "enqueue --timeout 30d");
    assert!(stderr_of(&cli).contains("24 days"), "{}", stderr_of(&cli));
    let url = db.url.clone();
    let run = tokio::task::spawn_blocking(move || {
        run_pgwake(
            &["run", "--handler", "t=exec:true", "--job-timeout", "30d"],
            Some(&url),
        )
    })
    .await
    .unwrap();
    assert_refused(&run, "run --job-timeout 30d");
    assert!(
        stderr_of(&run).contains("--job-timeout"),
        "{}",
        stderr_of(&run)
    );
    let sql = c
        .execute(
            "INSERT INTO pgwake.jobs (task, timeout) VALUES ('t', interval '25 days')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        sql.as_db_error().unwrap().constraint(),
        Some("jobs_timeout_max"),
        "{sql:?}"
    );
    let rust = enqueue(
        &c,
        &NewJob::new("t", serde_json::json!({})).timeout(Duration::from_secs(25 * 86400)),
    )
    .await
    .unwrap_err();
    assert!(rust.to_string().contains("24 days"), "{rust}");

    // The largest allowed timeout runs in tx mode.
    c.batch_execute("CREATE FUNCTION noop(p jsonb) RETURNS void LANGUAGE sql AS $$ SELECT $$")
        .await
        .unwrap();
    let id = enqueue(
        &c,
        &NewJob::new("t", serde_json::json!({})).timeout(Duration::from_secs(24 * 86400)),
    )
    .await
    .unwrap();
    let worker = pgwake::Worker::builder(db.config())
        .config(test_config())
        .handler(
            "t",
            pgwake::handlers::sql::SqlHandler::parse("noop").unwrap(),
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w
        .next_events(1, Duration::from_secs(60), |e| e.id == id)
        .await
        .remove(0);
    assert_eq!(ev.resolution, pgwake::Resolution::Done);
    w.shutdown().await;
}

#[tokio::test]
async fn max_running_above_100000_is_refused_by_the_cli_and_sql() {
    let db = migrated_db().await;
    let url = db.url.clone();
    let cli = tokio::task::spawn_blocking(move || {
        run_pgwake(
            &["queue", "set", "q", "--max-running", "3000000"],
            Some(&url),
        )
    })
    .await
    .unwrap();
    assert_refused(&cli, "queue set --max-running 3000000");
    assert!(stderr_of(&cli).contains("100000"), "{}", stderr_of(&cli));
    let sql = db
        .client()
        .await
        .execute("SELECT pgwake.set_queue_max_running('q', 3000000)", &[])
        .await
        .unwrap_err();
    assert!(format!("{sql:?}").contains("100000"), "{sql:?}");
    let slots: i64 = db.scalar("SELECT count(*) FROM pgwake.queue_slots").await;
    assert_eq!(slots, 0);
}

#[tokio::test]
async fn keys_above_1024_bytes_are_refused_with_a_message_naming_the_limit() {
    let db = migrated_db().await;
    let long = "k".repeat(3000);
    for flag in ["--unique-key", "--ordering-key"] {
        let url = db.url.clone();
        let long = long.clone();
        let cli = tokio::task::spawn_blocking(move || {
            run_pgwake(&["enqueue", "--task", "t", flag, &long], Some(&url))
        })
        .await
        .unwrap();
        assert_refused(&cli, flag);
        assert!(
            stderr_of(&cli).contains("1024 bytes"),
            "{}",
            stderr_of(&cli)
        );
    }
    let c = db.client().await;
    for column in ["unique_key", "ordering_key"] {
        let e = c
            .execute(
                &format!(
                    "INSERT INTO pgwake.jobs (task, {column}) VALUES ('t', repeat('k', 3000))"
                ),
                &[],
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.as_db_error().unwrap().constraint(),
            Some("jobs_keys_length"),
            "{column}: {e:?}"
        );
    }
    let rust = enqueue(
        &c,
        &NewJob::new("t", serde_json::json!({})).unique_key(&long),
    )
    .await
    .unwrap_err();
    assert!(rust.to_string().contains("1024 bytes"), "{rust}");
    let n: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(n, 0, "nothing was enqueued");
}

#[tokio::test]
async fn queue_names_with_control_characters_are_refused_and_printed_safely() {
    let db = migrated_db().await;
    let c = db.client().await;
    let e = c
        .execute(
            "INSERT INTO pgwake.jobs (task, queue) VALUES ('t', E'red\\x1b[31mqueue')",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        e.as_db_error().unwrap().constraint(),
        Some("jobs_queue_printable"),
        "{e:?}"
    );
    // A dead job keeps whatever its queue was called when it died (say
    // before this bound): `pgwake stats` shows it escaped.
    c.batch_execute(
        "INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
             max_attempts, last_error, created_at)
         VALUES (1, E'red\\x1b[31mqueue', 't', '{}', 0, now(), 1, 1, 'x', now())",
    )
    .await
    .unwrap();
    let url = db.url.clone();
    let o = tokio::task::spawn_blocking(move || run_pgwake(&["stats"], Some(&url)))
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(
        !out.contains('\u{1b}'),
        "a raw escape reached the terminal: {out:?}"
    );
    assert!(out.contains("red\\u{1b}[31mqueue"), "{out}");
}

/// Task names are bounded like queue names (issue 33, item 11): a control
/// character is refused by the table, for plain INSERTs and the client
/// alike, naming the constraint. Fails without migration 0025.
#[tokio::test]
async fn task_names_with_control_characters_are_refused() {
    let db = migrated_db().await;
    let c = db.client().await;
    for task in ["red\x1b[31mtask", "two\nlines", "bell\x07"] {
        let e = c
            .execute(
                &format!("INSERT INTO pgwake.jobs (task) VALUES (E'{task}')"),
                &[],
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.as_db_error().unwrap().constraint(),
            Some("jobs_task_printable"),
            "{e:?}"
        );
    }
    let rust = enqueue(&c, &NewJob::new("a\u{1b}[2Jb", serde_json::json!({})))
        .await
        .unwrap_err();
    assert!(rust.to_string().contains("jobs_task_printable"), "{rust}");
    let n: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(n, 0, "nothing was enqueued");
}

/// A worker whose claims fail for any reason reports not ready (it did
/// only for connection errors: a worker that could not claim at all looked
/// healthy), and ready again once a claim succeeds.
#[tokio::test]
async fn a_worker_whose_claims_fail_reports_not_ready_until_one_succeeds() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(&format!(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bounds_worker') THEN
                 CREATE ROLE bounds_worker LOGIN PASSWORD 'pw';
             END IF;
         END $$;
         GRANT CONNECT ON DATABASE {} TO bounds_worker;
         SELECT pgwake.grant_worker('bounds_worker');",
        db.name
    ))
    .await
    .unwrap();
    let mut config = db.config();
    config.user("bounds_worker");
    config.password("pw");
    let worker = pgwake::Worker::builder(config)
        .config(test_config())
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    assert!(w.health.ready());
    c.batch_execute("REVOKE DELETE ON pgwake.jobs FROM bounds_worker")
        .await
        .unwrap();
    insert_jobs(&db, "t", 1).await;
    let h = w.health.clone();
    eventually(
        "not ready while claims fail",
        Duration::from_secs(30),
        || {
            let h = h.clone();
            async move { !h.ready() }
        },
    )
    .await;
    c.batch_execute("GRANT DELETE ON pgwake.jobs TO bounds_worker")
        .await
        .unwrap();
    eventually("ready again after a claim", Duration::from_secs(60), || {
        let h = h.clone();
        async move { h.ready() }
    })
    .await;
    w.shutdown().await;
}
