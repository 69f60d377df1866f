//! Waits for a signal (`Outcome::WaitFor`, `pgwake.signal`), in both
//! delivery modes: a signal after the wait resumes the job with its
//! payload, a signal before the wait is kept and taken by the first wait,
//! a timeout resumes it as timed out, no wait uses an attempt, two jobs on
//! one key both wake, a cancel ends a waiting job, a database restart
//! loses no wait, signals racing the wait are never lost, and hostile keys
//! are refused naming the bound.

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

/// Tells the test when it is about to wait (its first run), so the test
/// can send the signal while the run ends: the signal races the wait's
/// write (tx mode: its claim transaction; lease mode: the statement that
/// writes the wait and the one that takes kept signals).
#[derive(Clone)]
struct Racer {
    about_to_wait: tokio::sync::mpsc::UnboundedSender<i64>,
    seen: Waiter,
}

#[pgwake::async_trait]
impl pgwake::Handler for Racer {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let said = ctx.signal().await?;
        self.seen.0.lock().unwrap().push((job.id, said.clone()));
        Ok(match said {
            None => {
                let _ = self.about_to_wait.send(job.id);
                Outcome::wait_for(format!("race:{}", job.id), Duration::from_secs(20))
            }
            Some(_) => Outcome::Done,
        })
    }
}

/// 200 jobs, each signalled the moment its handler decides to wait, from
/// eight connections at once: whichever commits first, the signal and the
/// wait meet (the signal wakes the waiting job, or is kept and taken by
/// the wait), so every job resumes with its payload and none times out.
/// The race at volume, through the whole worker; the window in which a
/// signal could be lost is one round trip wide and this rarely hits it
/// (it passed with the key's lock removed): the next test makes it certain.
async fn signals_racing_the_wait_are_never_lost(lease: bool) {
    const JOBS: usize = 200;
    let db = migrated_db().await;
    let client = db.client().await;
    let (tx, mut about_to_wait) = tokio::sync::mpsc::unbounded_channel();
    let racer = Racer {
        about_to_wait: tx,
        seen: Waiter::default(),
    };
    let mut ids = Vec::new();
    for i in 0..JOBS {
        ids.push(
            enqueue(
                &client,
                &NewJob::new("race", serde_json::json!({"i": i})).max_attempts(1),
            )
            .await
            .unwrap(),
        );
    }
    let mut senders = Vec::new();
    for _ in 0..8 {
        senders.push(Arc::new(db.client().await));
    }
    let mut w = Running::start(
        Worker::builder(db.config())
            .config(WorkerConfig {
                concurrency: 16,
                ..config(lease)
            })
            .handler("race", racer.clone())
            .build()
            .unwrap(),
    );
    let sending = tokio::spawn(async move {
        let mut sent = Vec::new();
        for n in 0..JOBS {
            let id = about_to_wait.recv().await.expect("a job about to wait");
            let c = senders[n % senders.len()].clone();
            sent.push(tokio::spawn(async move {
                signal(&*c, &format!("race:{id}"), Some(&serde_json::json!(id)))
                    .await
                    .unwrap()
            }));
        }
        for s in sent {
            s.await.unwrap();
        }
    });
    let ended = w
        .next_events(JOBS, Duration::from_secs(120), |e| {
            e.outcome() == "done" || e.outcome() == "dead"
        })
        .await;
    sending.await.unwrap();
    w.shutdown().await;
    assert!(ended.iter().all(|e| e.outcome() == "done"));
    let mut lost = Vec::new();
    for id in ids {
        let said = racer.seen.of(id);
        if said != vec![None, Some(Signal::Received(serde_json::json!(id)))] {
            lost.push((id, said));
        }
    }
    assert!(lost.is_empty(), "signals lost to the race: {lost:?}");
}

#[tokio::test]
async fn tx_mode_signals_racing_the_wait_are_never_lost() {
    signals_racing_the_wait_are_never_lost(false).await;
}

#[tokio::test]
async fn lease_mode_signals_racing_the_wait_are_never_lost() {
    signals_racing_the_wait_are_never_lost(true).await;
}

/// Advisory lock (classid 0, objid 4242) the test holds to keep a
/// signal's transaction from committing; `pgwake.signal_lock`'s keys have
/// classid `x'70677369'` ("pgsi").
const GATE: i64 = 4242;
const SIGNAL_LOCK_CLASS: i64 = 0x7067_7369;

/// Not-granted advisory locks of this test's database with this classid
/// (and objid, if given): the cluster is shared with other tests.
async fn lock_waiters(c: &tokio_postgres::Client, class: i64, obj: Option<i64>) -> i64 {
    c.query_one(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         AND classid::int8 = $1 AND ($2::int8 IS NULL OR objid::int8 = $2)",
        &[&class, &obj],
    )
    .await
    .unwrap()
    .get(0)
}

/// The race made certain: a signal has looked for waiting jobs (none yet)
/// and kept itself, but its transaction has not committed (a deferred
/// trigger the test adds holds the commit) when the job's wait is written
/// and the worker takes kept signals. The worker's take must wait for the
/// signal's commit (the key's advisory lock) and then deliver it; the job
/// resumes with the payload. Without the lock in `pgwake.signal` and
/// `pgwake.take_kept_signals` the take sees nothing, the signal commits a
/// moment later kept for a job that already waits, and the job times out
/// (checked, both modes: `[None, Some(TimedOut)]`). The rescuer, whose
/// sweep would deliver it later, is kept out of the way.
async fn a_signal_committing_while_the_wait_is_written_is_delivered(lease: bool) {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE FUNCTION public.hold_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$;
             CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT ON pgwake.signals
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.hold_commit();",
        )
        .await
        .unwrap();
    let gate = db.client().await;
    gate.query("SELECT pg_advisory_lock($1)", &[&GATE])
        .await
        .unwrap();
    let sender = db.client().await;
    let sending = tokio::spawn(async move {
        signal(&sender, "in-flight", Some(&serde_json::json!("paid")))
            .await
            .unwrap()
    });
    eventually(
        "the signal, kept, waits to commit",
        Duration::from_secs(30),
        || async { lock_waiters(&client, 0, Some(GATE)).await == 1 },
    )
    .await;
    let id = job(&client, "in-flight", 20.0).await;
    let h = Waiter::default();
    let mut w = Running::start(
        Worker::builder(db.config())
            .config(WorkerConfig {
                rescue_interval: Duration::from_secs(3600),
                ..config(lease)
            })
            .handler("w", h.clone())
            .build()
            .unwrap(),
    );
    // The wait is written; the worker's take of kept signals either waits
    // for the signal's key (the lock) or has finished without it.
    let taken = wait_for(
        "the wait written and kept signals taken",
        Duration::from_secs(30),
        async || {
            if lock_waiters(&client, SIGNAL_LOCK_CLASS, None).await > 0 {
                return Ok("waits for the signal's commit");
            }
            match w.events.try_recv() {
                Ok(e) if e.outcome() == "waiting_for_signal" => Ok("finished without the signal"),
                Ok(e) => Err(format!("event {}", e.outcome())),
                Err(e) => Err(format!("{e:?}")),
            }
        },
    )
    .await;
    gate.query("SELECT pg_advisory_unlock($1)", &[&GATE])
        .await
        .unwrap();
    assert_eq!(sending.await.unwrap(), 0, "no job waited when it looked");
    w.next_events(1, Duration::from_secs(60), |e| {
        e.id == id && e.outcome() == "done"
    })
    .await;
    w.shutdown().await;
    assert_eq!(
        h.of(id),
        vec![None, Some(Signal::Received(serde_json::json!("paid")))],
        "the take {taken}"
    );
}

#[tokio::test]
async fn tx_mode_a_signal_committing_while_the_wait_is_written_is_delivered() {
    a_signal_committing_while_the_wait_is_written_is_delivered(false).await;
}

#[tokio::test]
async fn lease_mode_a_signal_committing_while_the_wait_is_written_is_delivered() {
    a_signal_committing_while_the_wait_is_written_is_delivered(true).await;
}
