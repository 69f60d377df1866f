//! Per-job timeouts, in both delivery modes: a job's own `timeout` beats
//! the worker's, a Rust handler can extend its run, and a SQL job that
//! times out is cancelled on the server (it does not go on running there,
//! holding a pooled connection).

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};

fn config(lease: bool) -> WorkerConfig {
    WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        lease_duration: Duration::from_secs(1),
        ..test_config()
    }
}

/// Sleeps as long as the payload says, then succeeds.
struct SleepsFor;

#[async_trait]
impl Handler for SleepsFor {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let ms = job.payload["ms"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Outcome::Done)
    }
}

async fn a_jobs_own_timeout_beats_the_workers(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let short = enqueue(
        &client,
        &NewJob::new("sleep", serde_json::json!({"ms": 60_000}))
            .timeout(Duration::from_millis(300))
            .max_attempts(1),
    )
    .await
    .unwrap();
    let long = enqueue(
        &client,
        &NewJob::new("sleep", serde_json::json!({"ms": 1500}))
            .timeout(Duration::from_secs(30))
            .max_attempts(1),
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(1),
            ..config(lease)
        })
        .handler("sleep", SleepsFor)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let mut ev = w.next_events(2, Duration::from_secs(60), |_| true).await;
    w.shutdown().await;
    ev.sort_by_key(|e| e.id);
    assert_eq!((ev[0].id, ev[0].outcome()), (short, "dead"));
    assert_eq!(
        ev[0].error(),
        Some("timed out after 300ms (attempt 1 of 1)")
    );
    assert_eq!(
        (ev[1].id, ev[1].outcome()),
        (long, "done"),
        "1.5 s is past the worker's 1 s but within the job's own 30 s"
    );
}

#[tokio::test]
async fn tx_mode_a_jobs_own_timeout_beats_the_workers() {
    a_jobs_own_timeout_beats_the_workers(false).await;
}

#[tokio::test]
async fn lease_mode_a_jobs_own_timeout_beats_the_workers() {
    a_jobs_own_timeout_beats_the_workers(true).await;
}

#[tokio::test]
async fn the_sql_function_and_the_cli_set_a_jobs_timeout() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id: i64 = client
        .query_one(
            "SELECT pgwake.enqueue('t', timeout => interval '90 seconds')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let out = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["enqueue", "--task", "t", "--timeout", "2h"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = client
        .query(
            "SELECT id, extract(epoch FROM timeout)::float8 FROM pgwake.jobs ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(i64, f64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(got[0], (id, 90.0));
    assert_eq!(got[1].1, 7200.0);
    // A timeout that is not a duration is refused, naming the field.
    let out = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["enqueue", "--ndjson"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            // The process may have judged the line and exited already.
            let _ = c
                .stdin
                .take()
                .unwrap()
                .write_all(br#"{"task": "t", "timeout": "soon"}"#);
            c.wait_with_output()
        })
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("timeout"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Extends its 300 ms timeout by 10 s, then works for 1.5 s.
struct Extends;

#[async_trait]
impl Handler for Extends {
    async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        ctx.extend_timeout(Duration::from_secs(10)).await?;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        Ok(Outcome::Done)
    }
}

async fn a_handler_can_extend_its_own_timeout(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_millis(300),
            ..config(lease)
        })
        .handler("t", Extends)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let ev = w.next_events(1, Duration::from_secs(60), |_| true).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "done", "{:?}", ev[0].error());
}

#[tokio::test]
async fn tx_mode_a_handler_can_extend_its_own_timeout() {
    a_handler_can_extend_its_own_timeout(false).await;
}

#[tokio::test]
async fn lease_mode_a_handler_can_extend_its_own_timeout_past_its_lease() {
    a_handler_can_extend_its_own_timeout(true).await;
}

/// Issue repro: a timed-out SQL job kept running on the server, and in
/// lease mode its pooled connection went back to the pool still busy, so
/// the next job queued behind it.
async fn a_timed_out_sql_job_is_cancelled_on_the_server(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION sleepy(p jsonb) RETURNS void LANGUAGE sql AS $$ SELECT pg_sleep(3600) $$;
             CREATE TABLE quick_ran (n int);
             CREATE FUNCTION quick(p jsonb) RETURNS void LANGUAGE sql AS $$ INSERT INTO quick_ran VALUES (1) $$;",
        )
        .await
        .unwrap();
    let slow = enqueue(
        &client,
        &NewJob::new("sleepy", serde_json::json!({}))
            .max_attempts(1)
            .priority(0),
    )
    .await
    .unwrap();
    let quick = enqueue(
        &client,
        &NewJob::new("quick", serde_json::json!({})).priority(1),
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            job_timeout: Duration::from_secs(1),
            ..config(lease)
        })
        .handler_arc(
            "sleepy",
            pgwake::handlers::parse_flag("sleepy=sql:sleepy").unwrap().1,
        )
        .handler_arc(
            "quick",
            pgwake::handlers::parse_flag("quick=sql:quick").unwrap().1,
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let mut ev = w.next_events(2, Duration::from_secs(60), |_| true).await;
    ev.sort_by_key(|e| e.id);
    assert_eq!((ev[0].id, ev[0].outcome()), (slow, "dead"));
    assert_eq!((ev[1].id, ev[1].outcome()), (quick, "done"));
    eventually(
        "no server process still runs the timed-out function",
        Duration::from_secs(30),
        || async {
            let n: i64 = db
                .scalar("SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%sleepy%' AND state = 'active' AND pid <> pg_backend_pid()")
                .await;
            n == 0
        },
    )
    .await;
    w.shutdown().await;
}

#[tokio::test]
async fn tx_mode_a_timed_out_sql_job_is_cancelled_on_the_server() {
    a_timed_out_sql_job_is_cancelled_on_the_server(false).await;
}

#[tokio::test]
async fn lease_mode_a_timed_out_sql_job_is_cancelled_on_the_server() {
    a_timed_out_sql_job_is_cancelled_on_the_server(true).await;
}

/// Runs until the test opens the gate.
struct Gate(tokio::sync::watch::Receiver<bool>);

#[async_trait]
impl Handler for Gate {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.0.clone().wait_for(|open| *open).await?;
        Ok(Outcome::Done)
    }
}

/// A job that waited in the prefetch buffer longer than its timeout still
/// gets its whole timeout once it starts: the clock starts with the run.
#[tokio::test]
async fn lease_mode_a_prefetched_jobs_timeout_counts_from_its_start() {
    let db = migrated_db().await;
    let client = db.client().await;
    let gate = enqueue(&client, &NewJob::new("gate", serde_json::json!({})))
        .await
        .unwrap();
    let buffered = enqueue(
        &client,
        &NewJob::new("sleep", serde_json::json!({"ms": 0}))
            .timeout(Duration::from_millis(200))
            .max_attempts(1),
    )
    .await
    .unwrap();
    let (open, gate_rx) = tokio::sync::watch::channel(false);
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            prefetch: Some(1),
            ..config(true)
        })
        .handler("gate", Gate(gate_rx))
        .handler("sleep", SleepsFor)
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    // Both leased (one running, one buffered), the buffered one for longer
    // than its own timeout.
    wait_for(
        "the buffered job to wait past its timeout",
        Duration::from_secs(60),
        async || {
            let n: i64 = db
                .scalar(&format!(
                    "SELECT count(*) FROM pgwake.leased_jobs
                     WHERE id IN ({gate}, {buffered})
                       AND (id = {gate} OR clock_timestamp() - leased_at > interval '400 ms')"
                ))
                .await;
            (n == 2).then_some(()).ok_or_else(|| format!("{n} of 2"))
        },
    )
    .await;
    open.send(true).unwrap();
    let mut ev = w.next_events(2, Duration::from_secs(60), |_| true).await;
    w.shutdown().await;
    ev.sort_by_key(|e| e.id);
    assert_eq!((ev[0].id, ev[0].outcome()), (gate, "done"));
    assert_eq!(
        (ev[1].id, ev[1].outcome(), ev[1].error()),
        (buffered, "done", None),
        "its 200 ms started when it did, not when it was claimed"
    );
}
