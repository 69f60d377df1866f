//! Payloads reach every handler exactly as stored: big integers, long
//! decimals and numbers past f64's range keep every digit; a payload too
//! deep to decode still reaches handlers that take it as text; `pgwake dead
//! list` shows any dead payload.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker};

/// Numbers that an f64 round trip changes.
const EXACT: &str =
    r#"{"big": 12345678901234567890123, "dec": 0.10000000000000000001, "huge": 1e400}"#;

async fn insert_payload(db: &TestDb, task: &str, payload: &str) -> (i64, String) {
    let row = db
        .client()
        .await
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload) VALUES ($1, $2::text::jsonb) RETURNING id, payload::text",
            &[&task, &payload],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn exec_handlers_get_the_stored_payload_text_exactly() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let (id, stored) = insert_payload(&db, "keep", EXACT).await;
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let (deep_id, deep_stored) = insert_payload(&db, "keep", &deep).await;
    let handler = format!(
        "keep=exec:sh -c 'cat > {}/$PGWAKE_JOB_ID'",
        dir.path().display()
    );
    let child = spawn_pgwake_run(&db.url, &["--handler", &handler]);
    wait_files(dir.path(), "", 2).await;
    eventually("both jobs done", Duration::from_secs(30), || async {
        remaining(&db).await == 0
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    wait_exit(child, Duration::from_secs(30)).await;
    let got = std::fs::read_to_string(dir.path().join(id.to_string())).unwrap();
    assert_eq!(got, stored);
    assert!(got.contains("12345678901234567890123") && got.contains("0.10000000000000000001"));
    let got = std::fs::read_to_string(dir.path().join(deep_id.to_string())).unwrap();
    assert_eq!(got, deep_stored, "a payload too deep to decode still runs");
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 0);
}

#[tokio::test]
async fn sql_handlers_get_the_stored_payload_exactly() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE kept (p text);
             CREATE FUNCTION keep(p jsonb) RETURNS void LANGUAGE sql AS $$ INSERT INTO kept VALUES (p::text) $$;",
        )
        .await
        .unwrap();
    let (_, stored) = insert_payload(&db, "keep", EXACT).await;
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler_arc(
            "keep",
            pgwake::handlers::parse_flag("keep=sql:keep").unwrap().1,
        )
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 1);
    let kept: String = db.scalar("SELECT p FROM kept").await;
    assert_eq!(kept, stored);
}

/// Records what a Rust handler sees.
struct Sees(Arc<Mutex<Vec<(String, String)>>>);

#[async_trait]
impl Handler for Sees {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.0
            .lock()
            .unwrap()
            .push((job.payload["big"].to_string(), job.payload_text.clone()));
        Ok(Outcome::Done)
    }
}

#[tokio::test]
async fn rust_handlers_get_numbers_with_every_digit() {
    let db = migrated_db().await;
    let (_, stored) = insert_payload(&db, "see", EXACT).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler("see", Sees(seen.clone()))
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 1);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![("12345678901234567890123".to_string(), stored)],
        "1e400 did not send the job dead either"
    );
}

#[tokio::test]
async fn dead_list_shows_a_payload_that_cannot_be_decoded() {
    let db = migrated_db().await;
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    db.client()
        .await
        .execute(
            "INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
             VALUES (1, 'default', 't', $1::text::jsonb, 0, now(), 1, 1, 'deep', now())",
            &[&deep],
        )
        .await
        .unwrap();
    for args in [&["dead", "list"][..], &["dead", "list", "--json"][..]] {
        let out = pgwake_cmd()
            .env("DATABASE_URL", &db.url)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("[[[[[[[[[["));
    }
}
