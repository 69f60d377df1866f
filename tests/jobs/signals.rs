//! Waits for a signal (`Outcome::WaitFor`, `pgwake.signal`), in both
//! delivery modes: a signal after the wait resumes the job with its
//! payload, a signal before the wait is kept and taken by the first wait,
//! a timeout resumes it as timed out, no wait uses an attempt, two jobs on
//! one key both wake, a cancel ends a waiting job, a database restart
//! loses no wait, and hostile keys are refused naming the bound.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, signal, NewJob};
use pgwake::{BoxError, Job, JobContext, Outcome, Signal, Worker, WorkerConfig};

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

/// Waits for the signal its payload names (`{"key": …, "timeout": secs}`),
/// then, once it has one (or timed out), is done; records what
/// `ctx.signal()` said on each run.
#[derive(Clone, Default)]
struct Waiter(Arc<Mutex<Vec<Said>>>);

/// A job's id and what `ctx.signal()` said to one of its runs.
type Said = (i64, Option<Signal>);

#[pgwake::async_trait]
impl pgwake::Handler for Waiter {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let said = ctx.signal().await?;
        self.0.lock().unwrap().push((job.id, said.clone()));
        let key = job.payload["key"].as_str().unwrap_or("k").to_string();
        let timeout = Duration::from_secs_f64(job.payload["timeout"].as_f64().unwrap_or(3600.0));
        Ok(match said {
            None => Outcome::wait_for(key, timeout),
            Some(_) => Outcome::Done,
        })
    }
}

impl Waiter {
    fn of(&self, id: i64) -> Vec<Option<Signal>> {
        let seen = self.0.lock().unwrap();
        seen.iter()
            .filter(|(j, _)| *j == id)
            .map(|(_, s)| s.clone())
            .collect()
    }
}

fn worker(db: &TestDb, lease: bool, h: &Waiter) -> Running {
    Running::start(
        Worker::builder(db.config())
            .config(config(lease))
            .handler("w", h.clone())
            .build()
            .unwrap(),
    )
}

async fn job(client: &tokio_postgres::Client, key: &str, timeout: f64) -> i64 {
    enqueue(
        client,
        &NewJob::new("w", serde_json::json!({"key": key, "timeout": timeout})).max_attempts(1),
    )
    .await
    .unwrap()
}

/// Two jobs wait for one key (one attempt each: a wait that used one would
/// leave them out of attempts); a signal wakes both, each reads the payload,
/// and both end done on attempt 1. explain said why they waited.
async fn a_signal_wakes_every_job_waiting_for_it(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let a = job(&client, "payment:42", 3600.0).await;
    let b = job(&client, "payment:42", 3600.0).await;
    let h = Waiter::default();
    let mut w = worker(&db, lease, &h);
    let waited = w
        .next_events(2, Duration::from_secs(30), |e| {
            e.outcome() == "waiting_for_signal"
        })
        .await;
    assert!(waited.iter().all(|e| e.attempt == 1));
    let (reason, words): (String, String) = {
        let r = client
            .query_one("SELECT reason, detail FROM pgwake.explain($1)", &[&a])
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(reason, "waiting_for_signal", "{words}");
    assert!(words.contains("payment:42"), "{words}");
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let stats = pgwake::admin::stats::read(&pool).await.unwrap();
    let default = stats.iter().find(|s| s.queue == "default").unwrap();
    assert_eq!(
        (
            default.scheduled,
            default.sleeping,
            default.waiting_for_signal
        ),
        (2, 0, 2),
        "stats counts them by kind"
    );
    let woke = signal(
        &client,
        "payment:42",
        Some(&serde_json::json!({"paid": 12})),
    )
    .await
    .unwrap();
    assert_eq!(woke, 2);
    let done = w
        .next_events(2, Duration::from_secs(30), |e| e.outcome() == "done")
        .await;
    w.shutdown().await;
    assert!(done.iter().all(|e| e.attempt == 1), "no attempt used");
    for id in [a, b] {
        assert_eq!(
            h.of(id),
            vec![
                None,
                Some(Signal::Received(serde_json::json!({"paid": 12})))
            ]
        );
    }
}

#[tokio::test]
async fn tx_mode_a_signal_wakes_every_job_waiting_for_it() {
    a_signal_wakes_every_job_waiting_for_it(false).await;
}

#[tokio::test]
async fn lease_mode_a_signal_wakes_every_job_waiting_for_it() {
    a_signal_wakes_every_job_waiting_for_it(true).await;
}

/// A signal sent before anyone waits wakes no job and is kept; the first
/// job to wait for its key takes it and resumes at once with its payload;
/// it is gone then, so a second job that waits for the key waits.
async fn a_signal_before_the_wait_is_kept_for_the_first_waiter(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let woke = signal(&client, "early", Some(&serde_json::json!("hello")))
        .await
        .unwrap();
    assert_eq!(woke, 0);
    let first = job(&client, "early", 3600.0).await;
    let h = Waiter::default();
    let mut w = worker(&db, lease, &h);
    let ev = w
        .next_events(2, Duration::from_secs(30), |e| e.id == first)
        .await;
    let seen: Vec<&str> = ev.iter().map(|e| e.outcome()).collect();
    assert_eq!(seen, ["waiting_for_signal", "done"]);
    assert_eq!(
        h.of(first),
        vec![None, Some(Signal::Received(serde_json::json!("hello")))]
    );
    let kept: i64 = db.scalar("SELECT count(*) FROM pgwake.signals").await;
    assert_eq!(kept, 0, "the first wait took the kept signal");
    let second = job(&client, "early", 3600.0).await;
    w.next_events(1, Duration::from_secs(30), |e| {
        e.id == second && e.outcome() == "waiting_for_signal"
    })
    .await;
    w.shutdown().await;
    let waits: bool = client
        .query_one(
            "SELECT run_at > now() + interval '50 minutes' FROM pgwake.jobs WHERE id = $1",
            &[&second],
        )
        .await
        .unwrap()
        .get(0);
    assert!(waits, "the second job waits: the kept signal was consumed");
}

#[tokio::test]
async fn tx_mode_a_signal_before_the_wait_is_kept_for_the_first_waiter() {
    a_signal_before_the_wait_is_kept_for_the_first_waiter(false).await;
}

#[tokio::test]
async fn lease_mode_a_signal_before_the_wait_is_kept_for_the_first_waiter() {
    a_signal_before_the_wait_is_kept_for_the_first_waiter(true).await;
}

/// No signal within the timeout: the job runs again, told it timed out,
/// with no attempt used.
async fn a_wait_times_out_and_the_handler_is_told(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = job(&client, "never", 1.0).await;
    let h = Waiter::default();
    let mut w = worker(&db, lease, &h);
    let ev = w.next_events(2, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    let seen: Vec<(i32, &str)> = ev.iter().map(|e| (e.attempt, e.outcome())).collect();
    assert_eq!(seen, [(1, "waiting_for_signal"), (1, "done")]);
    assert_eq!(h.of(id), vec![None, Some(Signal::TimedOut)]);
}

#[tokio::test]
async fn tx_mode_a_wait_times_out_and_the_handler_is_told() {
    a_wait_times_out_and_the_handler_is_told(false).await;
}

#[tokio::test]
async fn lease_mode_a_wait_times_out_and_the_handler_is_told() {
    a_wait_times_out_and_the_handler_is_told(true).await;
}

/// A waiting job is cancelled at once; a signal then wakes nothing.
async fn a_waiting_job_is_cancelled(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = job(&client, "c", 3600.0).await;
    let h = Waiter::default();
    let mut w = worker(&db, lease, &h);
    w.next_events(1, Duration::from_secs(30), |_| true).await;
    let r: String = client
        .query_one("SELECT pgwake.cancel($1)", &[&id])
        .await
        .unwrap()
        .get(0);
    assert_eq!(r, "cancelled");
    assert_eq!(signal(&client, "c", None).await.unwrap(), 0);
    w.shutdown().await;
    assert_eq!(dead_reason(&client, id).await, "cancelled");
}

#[tokio::test]
async fn tx_mode_a_waiting_job_is_cancelled() {
    a_waiting_job_is_cancelled(false).await;
}

#[tokio::test]
async fn lease_mode_a_waiting_job_is_cancelled() {
    a_waiting_job_is_cancelled(true).await;
}

/// The database restarts while a job waits: the wait is in the database,
/// so a signal after the restart wakes it (a new worker) with its payload.
async fn a_restart_loses_no_wait(lease: bool) {
    let (cluster, db) = private_cluster_db().await;
    let client = db.client().await;
    let id = job(&client, "after-restart", 3600.0).await;
    let h = Waiter::default();
    let mut w = worker(&db, lease, &h);
    w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    drop(client);
    let cluster = Arc::new(cluster);
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.restart("immediate"))
        .await
        .unwrap()
        .unwrap();
    let client = db.client().await;
    assert_eq!(
        signal(&client, "after-restart", Some(&serde_json::json!(1)))
            .await
            .unwrap(),
        1
    );
    let mut w = worker(&db, lease, &h);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!((ev[0].attempt, ev[0].outcome()), (1, "done"));
    assert_eq!(
        h.of(id),
        vec![None, Some(Signal::Received(serde_json::json!(1)))]
    );
}

#[tokio::test]
async fn tx_mode_a_restart_loses_no_wait() {
    a_restart_loses_no_wait(false).await;
}

#[tokio::test]
async fn lease_mode_a_restart_loses_no_wait() {
    a_restart_loses_no_wait(true).await;
}

/// Keys over the bound, with control characters or empty, and payloads
/// over the bound are refused by the client and by SQL, naming the bound;
/// a handler that waits with such a key, or longer than SLEEP_MAX, has a
/// failed attempt saying so.
#[tokio::test]
async fn hostile_keys_and_waits_are_refused_naming_the_bound() {
    let db = migrated_db().await;
    let client = db.client().await;
    let long = "k".repeat(pgwake::config::KEY_MAX + 1);
    for (key, words) in [
        (long.as_str(), "1024"),
        ("a\u{1}b", "control character"),
        ("", "empty"),
    ] {
        let e = signal(&client, key, None).await.unwrap_err().to_string();
        assert!(e.contains(words), "{e}");
        let e = client
            .query_one("SELECT pgwake.signal($1)", &[&key])
            .await
            .unwrap_err();
        let e = e.as_db_error().unwrap().message().to_string();
        assert!(e.contains(words), "{e}");
    }
    let big = serde_json::json!("x".repeat(pgwake::SIGNAL_PAYLOAD_MAX));
    let e = signal(&client, "k", Some(&big))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("SIGNAL_PAYLOAD_MAX"), "{e}");
    let e = client
        .query_one(
            "SELECT pgwake.signal('k', to_jsonb(repeat('x', 70000)))",
            &[],
        )
        .await
        .unwrap_err();
    assert!(e.as_db_error().unwrap().message().contains("65536"), "{e}");

    let long_wait = job(&client, &long, 3600.0).await;
    let too_far = job(&client, "k", 400.0 * 86400.0).await;
    let h = Waiter::default();
    let mut w = worker(&db, false, &h);
    let ev = w.next_events(2, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert!(ev.iter().all(|e| e.outcome() == "dead"));
    let r = dead_reason(&client, long_wait).await;
    assert!(r.contains("KEY_MAX"), "{r}");
    let r = dead_reason(&client, too_far).await;
    assert!(r.contains("SLEEP_MAX"), "{r}");
}
