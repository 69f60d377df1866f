//! Cancellation (`pgwake cancel`, `pgwake.cancel()`, `pgwake::admin::cancel`): a
//! waiting job leaves the queue at once; a running one is stopped on the
//! worker that runs it, in both delivery modes (tx: its work rolled back;
//! lease: its process killed, its late writes fenced), also when the
//! worker's listener missed the notification; every cancelled job is in
//! `dead_jobs` as `cancelled`; a cancel racing a claim loses no job.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::handlers::exec::ExecHandler;
use pgwake::handlers::sql::SqlHandler;
use pgwake::{
    async_trait, BoxError, CancelOutcome, Handler, Job, JobContext, Outcome, Resolution, Worker,
    WorkerConfig,
};

const LONG: Duration = Duration::from_secs(60);

/// A SQL handler that writes a row through the claim transaction, then
/// sleeps for an hour on the server.
async fn create_slow_sql_function(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE effects (n int NOT NULL);
             CREATE FUNCTION slow(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO effects VALUES ((p->>'n')::int);
                 PERFORM pg_sleep(3600);
             END $$;",
        )
        .await
        .unwrap();
}

/// Writes its pid to `DIR/<job id>.pid`, then becomes `sleep 600`.
fn sleeper_command(dir: &Path) -> String {
    format!(
        "sh -c 'echo $$ > {}/$PGWAKE_JOB_ID.pid; exec sleep 600'",
        dir.display()
    )
}

/// [`sleeper_command`] as an in-process handler.
fn sleeper(dir: &Path) -> ExecHandler {
    ExecHandler::parse(&sleeper_command(dir)).unwrap()
}

/// Whether process `pid` is gone (or a zombie: dead, not yet reaped).
fn process_dead(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // "pid (comm) S …": the state follows the last ')'.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

fn metric(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn counts(db: &TestDb) -> (i64, i64) {
    let jobs: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
    (jobs, leased)
}

#[tokio::test]
async fn a_waiting_job_moves_to_dead_jobs_as_cancelled_and_dead_retry_brings_it_back() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("t", serde_json::json!({"k": 1})))
        .await
        .unwrap();
    let later = enqueue(
        &client,
        &NewJob::new("t", serde_json::json!({})).delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();

    let out = run_pgwake(
        &["cancel", &id.to_string(), &later.to_string()],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{id}: cancelled (it was waiting"))
            && stdout.contains(&format!("{later}: cancelled")),
        "{stdout}"
    );
    assert_eq!(counts(&db).await, (0, 0), "nothing left queued");
    assert_eq!(dead_reason(&client, id).await, "cancelled");
    let payload: String = client
        .query_one(
            "SELECT payload::text FROM pgwake.dead_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload, r#"{"k": 1}"#, "recorded intact, never dropped");

    let list = run_pgwake(&["dead", "list"], Some(&db.url));
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(listed.contains("cancelled"), "{listed}");

    // A cancelled job (and its request, had it had one) is gone for good
    // only if the operator says so: `dead retry` brings it back, runnable.
    client
        .execute(
            "INSERT INTO pgwake.cancel_requests (job_id) VALUES ($1)",
            &[&id],
        )
        .await
        .unwrap();
    let retry = run_pgwake(&["dead", "retry", "--id", &id.to_string()], Some(&db.url));
    assert!(retry.status.success(), "{}", stderr_of(&retry));
    let back: i64 = db
        .scalar(&format!("SELECT count(*) FROM pgwake.jobs WHERE id = {id}"))
        .await;
    let requests: i64 = db
        .scalar("SELECT count(*) FROM pgwake.cancel_requests")
        .await;
    assert_eq!((back, requests), (1, 0));
}

/// The runbook's answer to the dead-jobs alert, `pgwake dead retry --all
/// --queue Q` (and the console's bulk retry), revives dead jobs only: a job
/// an operator cancelled on purpose stays cancelled unless asked for in so
/// many words (issue 33, item 12). Before, the bulk retry ran cancelled
/// jobs again (a double charge or email).
#[tokio::test]
async fn a_bulk_retry_leaves_cancelled_jobs_alone_unless_asked() {
    let db = migrated_db().await;
    let c = db.client().await;
    let ids: Vec<i64> = c
        .query(
            "INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                 max_attempts, last_error, created_at)
             VALUES (nextval('pgwake.jobs_id_seq'), 'mail', 't', '{}', 0, now(), 3, 3, 'boom', now()),
                    (nextval('pgwake.jobs_id_seq'), 'mail', 't', '{}', 0, now(), 1, 3, 'cancelled', now())
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let (died, cancelled) = (ids[0], ids[1]);
    let in_queue = async || -> Vec<i64> {
        c.query("SELECT id FROM pgwake.jobs ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };

    // The library's bulk selection: the cancelled job only by its state.
    let filter = pgwake::admin::jobs::JobFilter {
        queue: Some("mail".into()),
        page: 100,
        ..Default::default()
    };
    let retry = pgwake::admin::bulk::BulkAction::Retry;
    let m = pgwake::admin::bulk::select(&c, &filter, retry)
        .await
        .unwrap();
    assert_eq!(m.ids, vec![died], "a bulk retry selects the dead job only");
    let named = pgwake::admin::jobs::JobFilter {
        state: Some("cancelled".into()),
        ..filter.clone()
    };
    let m = pgwake::admin::bulk::select(&c, &named, retry)
        .await
        .unwrap();
    assert_eq!(
        m.ids,
        vec![cancelled],
        "filtered on its state, it is retried"
    );

    // The command line.
    let o = run_pgwake(
        &["dead", "retry", "--all", "--queue", "mail"],
        Some(&db.url),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("moved 1 dead jobs"), "{out}");
    assert!(
        out.contains("left 1 cancelled") && out.contains("--include-cancelled"),
        "{out}"
    );
    assert_eq!(in_queue().await, vec![died]);
    let o = run_pgwake(
        &[
            "dead",
            "retry",
            "--all",
            "--queue",
            "mail",
            "--include-cancelled",
        ],
        Some(&db.url),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert_eq!(in_queue().await, vec![died, cancelled]);
}

#[tokio::test]
async fn cancelling_unknown_finished_or_dead_ids_says_so_and_exits_2() {
    let db = migrated_db().await;
    let client = db.client().await;
    // A finished job: run to completion by a worker.
    let finished = enqueue(&client, &NewJob::new("ok", serde_json::json!({})))
        .await
        .unwrap();
    let worker = Worker::builder(db.config())
        .config(test_config())
        .handler("ok", ExecHandler::parse("true").unwrap())
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 1);
    assert_eq!(counts(&db).await, (0, 0));
    let waiting = enqueue(&client, &NewJob::new("ok", serde_json::json!({})))
        .await
        .unwrap();
    let dead = enqueue(&client, &NewJob::new("ok", serde_json::json!({})))
        .await
        .unwrap();
    assert_eq!(
        pgwake::cancel(&client, dead).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let unknown = 987_654_321_i64;

    let ids = [finished, waiting, dead, unknown].map(|i| i.to_string());
    let mut args = vec!["cancel"];
    args.extend(ids.iter().map(String::as_str));
    let out = run_pgwake(&args, Some(&db.url));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "{finished}: not cancelled: finished (no longer queued, running or dead)"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{waiting}: cancelled")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{dead}: not cancelled: already dead")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("{unknown}: not cancelled: no such job")),
        "{stdout}"
    );
    let err = stderr_of(&out);
    assert!(
        err.contains("3 of 4 jobs could not be cancelled")
            && err.contains(&format!("{unknown} (not_found)"))
            && err.contains(&format!("{finished} (finished)"))
            && err.contains(&format!("{dead} (dead)")),
        "{err}"
    );
    // The one that could be cancelled was, whatever the others.
    assert_eq!(dead_reason(&client, waiting).await, "cancelled");

    // The SQL function tells the cases apart too.
    let sql: String = client
        .query_one("SELECT pgwake.cancel($1)", &[&unknown])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sql, "not_found");
    let sql: String = client
        .query_one("SELECT pgwake.cancel($1)", &[&finished])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sql, "finished");
    let sql: String = client
        .query_one("SELECT pgwake.cancel($1)", &[&dead])
        .await
        .unwrap()
        .get(0);
    assert_eq!(sql, "dead");

    // --json: one object per id.
    let out = run_pgwake(&["cancel", "--json", &unknown.to_string()], Some(&db.url));
    assert_eq!(out.status.code(), Some(2));
    let line: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(
        line,
        serde_json::json!({"id": unknown, "result": "not_found"})
    );
    // Not an id at all: refused before any work.
    let out = run_pgwake(&["cancel", "abc"], Some(&db.url));
    assert_eq!(out.status.code(), Some(2));
}

/// Start a tx-mode job of the `slow` SQL function on `worker` and wait
/// until its statement sleeps on the server; returns the job id.
async fn running_tx_job(db: &TestDb, queue: &str) -> i64 {
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("slow", serde_json::json!({"n": 1})).queue(queue),
    )
    .await
    .unwrap();
    eventually("the job's statement sleeps on the server", LONG, || async {
        let n: i64 = db
            // In pg_sleep: the worker's start-up check also runs a statement
            // naming "slow"( (it prepares the call), briefly active.
            .scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%\"slow\"(%' AND state = 'active' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()")
            .await;
        n == 1
    })
    .await;
    id
}

/// After a tx-mode cancel: recorded, rolled back, nothing left running.
async fn assert_tx_cancelled(db: &TestDb, id: i64) {
    let client = db.client().await;
    assert_eq!(dead_reason(&client, id).await, "cancelled");
    let effects: i64 = db.scalar("SELECT count(*) FROM effects").await;
    assert_eq!(effects, 0, "the handler's write was rolled back");
    assert_eq!(counts(db).await, (0, 0), "nothing left queued or leased");
    eventually("no statement of the job runs any more", LONG, || async {
        let n: i64 = db
            // In pg_sleep: the worker's start-up check also runs a statement
            // naming "slow"( (it prepares the call), briefly active.
            .scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%\"slow\"(%' AND state = 'active' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()")
            .await;
        n == 0
    })
    .await;
}

#[tokio::test]
async fn a_running_tx_job_is_stopped_its_work_rolled_back_and_it_is_recorded_cancelled() {
    let handle = pgwake::metrics::install();
    let db = migrated_db().await;
    create_slow_sql_function(&db).await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(600),
            // Only the notification can deliver the cancel in time.
            cancel_poll_interval: Duration::from_secs(3600),
            ..test_config()
        })
        .handler("slow", SqlHandler::parse("slow").unwrap())
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let id = running_tx_job(&db, "cancel_tx").await;

    // Through the command line, as an operator would.
    let url = db.url.clone();
    let out =
        tokio::task::spawn_blocking(move || run_pgwake(&["cancel", &id.to_string()], Some(&url)))
            .await
            .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("{id}: cancel requested (it is running")),
        "{stdout}"
    );
    let ev = w.next_events(1, LONG, |e| e.id == id).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Cancelled);
    assert_eq!(ev.outcome(), "cancelled");
    assert_tx_cancelled(&db, id).await;
    let text = handle.render();
    assert_eq!(
        metric(&text, "pgwake_jobs_cancelled_total", "queue=\"cancel_tx\""),
        1.0,
        "{text}"
    );
    assert!(
        metric(
            &text,
            "pgwake_jobs_total",
            "queue=\"cancel_tx\",task=\"slow\",outcome=\"cancelled\""
        ) >= 1.0,
        "{text}"
    );
    w.shutdown().await;
}

/// Start a lease-mode exec job and wait for its process; returns the job id
/// and the pid.
async fn running_lease_job(db: &TestDb, dir: &Path, queue: &str) -> (i64, i32) {
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("sleeper", serde_json::json!({})).queue(queue),
    )
    .await
    .unwrap();
    let file = dir.join(format!("{id}.pid"));
    let pid = wait_for("the job's process to start", LONG, async || {
        std::fs::read_to_string(&file)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
            .ok_or_else(|| "no pid file yet".to_string())
    })
    .await;
    (id, pid)
}

/// After a lease-mode cancel: the process is dead, the job recorded, its
/// lease gone (so it can be neither renewed nor completed), nothing queued.
async fn assert_lease_cancelled(db: &TestDb, id: i64, pid: i32) {
    eventually("the job's process is dead", LONG, || async {
        process_dead(pid)
    })
    .await;
    let client = db.client().await;
    assert_eq!(dead_reason(&client, id).await, "cancelled");
    assert_eq!(counts(db).await, (0, 0), "nothing left queued or leased");
    let renewed = client
        .query(
            include_str!("../../src/db/sql/lease_heartbeat.sql"),
            &[&vec![id], &30.0_f64],
        )
        .await
        .unwrap();
    assert!(renewed.is_empty());
}

#[tokio::test]
async fn a_running_lease_job_has_its_process_killed_and_its_lease_fenced() {
    let handle = pgwake::metrics::install();
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(600),
            cancel_poll_interval: Duration::from_secs(3600),
            ..test_config()
        })
        .handler("sleeper", sleeper(dir.path()))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let (id, pid) = running_lease_job(&db, dir.path(), "cancel_lease").await;
    let token: i64 = db
        .scalar(&format!(
            "SELECT token FROM pgwake.leased_jobs WHERE id = {id}"
        ))
        .await;

    let client = db.client().await;
    let sent = std::time::Instant::now();
    assert_eq!(
        pgwake::cancel(&client, id).await.unwrap(),
        CancelOutcome::Requested
    );
    let ev = w.next_events(1, LONG, |e| e.id == id).await.remove(0);
    // Recorded once stopped, and the run's token matches nothing since.
    assert_eq!(dead_reason(&client, id).await, "cancelled");
    let done = client
        .query(
            include_str!("../../src/db/sql/lease_done.sql"),
            &[&vec![token]],
        )
        .await
        .unwrap();
    assert!(done.is_empty(), "a cancelled lease cannot be completed");
    // A figure for the record, not a threshold.
    eprintln!(
        "lease cancel by notification: stopped after {:?}",
        sent.elapsed()
    );
    assert_eq!(ev.resolution, Resolution::Cancelled);
    assert_lease_cancelled(&db, id, pid).await;
    let text = handle.render();
    assert_eq!(
        metric(
            &text,
            "pgwake_jobs_cancelled_total",
            "queue=\"cancel_lease\""
        ),
        1.0,
        "{text}"
    );
    w.shutdown().await;
    assert_eq!(dead_reason(&client, id).await, "cancelled");
}

/// The listener never connects (its URL points nowhere): only the poll of
/// `pgwake.cancel_requests` can deliver the cancel.
async fn a_cancel_sent_while_the_listener_is_down_still_stops_the_job(lease: bool) {
    let db = migrated_db().await;
    create_slow_sql_function(&db).await;
    let dir = tempfile::tempdir().unwrap();
    let nowhere = pgwake::connect::parse_url("postgres://nobody@127.0.0.1:1/nowhere").unwrap();
    let worker = Worker::builder(db.config())
        .listen_database(nowhere)
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(600),
            poll_interval: Duration::from_millis(100),
            cancel_poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler("slow", SqlHandler::parse("slow").unwrap())
        .handler("sleeper", sleeper(dir.path()))
        .build()
        .unwrap();
    let health = worker.health();
    let mut w = Running::start(worker);
    let queue = if lease { "down_lease" } else { "down_tx" };
    let (id, pid) = if lease {
        running_lease_job(&db, dir.path(), queue).await
    } else {
        (running_tx_job(&db, queue).await, 0)
    };
    assert!(!health.listener_ok(), "the listener must be down");
    let client = db.client().await;
    let sent = std::time::Instant::now();
    assert_eq!(
        pgwake::cancel(&client, id).await.unwrap(),
        CancelOutcome::Requested
    );
    let ev = w.next_events(1, LONG, |e| e.id == id).await.remove(0);
    // A figure for the record, not a threshold.
    eprintln!(
        "lease={lease} cancel by poll (200ms interval): stopped after {:?}",
        sent.elapsed()
    );
    assert_eq!(ev.resolution, Resolution::Cancelled);
    assert!(!health.listener_ok(), "delivered without the listener");
    if lease {
        assert_lease_cancelled(&db, id, pid).await;
    } else {
        assert_tx_cancelled(&db, id).await;
    }
    w.shutdown().await;
}

#[tokio::test]
async fn a_cancel_sent_while_the_listener_is_down_still_stops_a_tx_job() {
    a_cancel_sent_while_the_listener_is_down_still_stops_the_job(false).await;
}

#[tokio::test]
async fn a_cancel_sent_while_the_listener_is_down_still_stops_a_lease_job() {
    a_cancel_sent_while_the_listener_is_down_still_stops_the_job(true).await;
}

#[tokio::test]
async fn a_cancel_sent_while_the_listener_reconnects_is_picked_up_by_the_poll() {
    // The listener's backend is terminated and the cancel goes out before
    // it is back: the NOTIFY reaches nobody, the request row does.
    let db = migrated_db().await;
    create_slow_sql_function(&db).await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(600),
            // Slow reconnects: the cancel surely lands while it is away.
            reconnect_min: Duration::from_secs(2),
            reconnect_max: Duration::from_secs(2),
            ..test_config()
        })
        .handler("slow", SqlHandler::parse("slow").unwrap())
        .build()
        .unwrap();
    let health = worker.health();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let id = running_tx_job(&db, "reconnect_tx").await;
    let admin = db.client().await;
    admin
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgwake-listener' AND datname = current_database()",
            &[],
        )
        .await
        .unwrap();
    let h = health.clone();
    eventually("the worker notices its listener is gone", LONG, move || {
        let h = h.clone();
        async move { !h.listener_ok() }
    })
    .await;
    assert_eq!(
        pgwake::cancel(&admin, id).await.unwrap(),
        CancelOutcome::Requested
    );
    let ev = w.next_events(1, LONG, |e| e.id == id).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Cancelled);
    assert_tx_cancelled(&db, id).await;
    w.shutdown().await;
}

/// Takes a few milliseconds, then succeeds (lease mode: no transaction).
struct Brief;

#[async_trait]
impl Handler for Brief {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let ms = job.payload["ms"].as_u64().unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        Ok(Outcome::Done)
    }
}

async fn a_cancel_racing_claims_never_loses_a_job(lease: bool) {
    const N: usize = 300;
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE effects (n int NOT NULL);
             CREATE FUNCTION brief(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
                 INSERT INTO effects VALUES ((p->>'n')::int);
                 PERFORM pg_sleep((p->>'ms')::float8 / 1000);
             END $$;",
        )
        .await
        .unwrap();
    let client = db.client().await;
    let ids: Vec<i64> = client
        .query(
            "INSERT INTO pgwake.jobs (task, payload)
             SELECT 'brief', jsonb_build_object('n', g, 'ms', g % 4) FROM generate_series(1, $1::int) g
             RETURNING id",
            &[&(N as i32)],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let builder = Worker::builder(db.config()).config(WorkerConfig {
        lease_queues: if lease {
            vec!["default".into()]
        } else {
            vec![]
        },
        cancel_poll_interval: Duration::from_millis(50),
        ..test_config()
    });
    let builder = if lease {
        builder.handler("brief", Brief)
    } else {
        builder.handler("brief", SqlHandler::parse("brief").unwrap())
    };
    let mut w = Running::start(builder.build().unwrap());
    let fresh = w.events.resubscribe();
    let mut events = std::mem::replace(&mut w.events, fresh);
    // Cancel every job from two connections while the worker claims them.
    let halves: Vec<Vec<i64>> = vec![
        ids.iter().copied().step_by(2).collect(),
        ids.iter().copied().skip(1).step_by(2).collect(),
    ];
    let mut cancels = Vec::new();
    for half in halves {
        let c = db.client().await;
        cancels.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for id in half {
                out.push((id, pgwake::cancel(&c, id).await.unwrap()));
            }
            out
        }));
    }
    let mut said: HashMap<i64, CancelOutcome> = HashMap::new();
    for c in cancels {
        said.extend(c.await.unwrap());
    }
    // Every job ends: done, or cancelled (in dead_jobs).
    let mut outcomes: HashMap<i64, Resolution> = HashMap::new();
    let want: HashSet<i64> = ids.iter().copied().collect();
    wait_for("every job to end", LONG, async || {
        while let Ok(ev) = events.try_recv() {
            outcomes.insert(ev.id, ev.resolution);
        }
        let dead: Vec<i64> = client
            .query(
                "SELECT id FROM pgwake.dead_jobs WHERE last_error = 'cancelled'",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let done: HashSet<i64> = outcomes
            .iter()
            .filter(|(_, r)| **r == Resolution::Done)
            .map(|(id, _)| *id)
            .collect();
        let ended: HashSet<i64> = done.iter().copied().chain(dead.iter().copied()).collect();
        let (jobs, leased) = counts(&db).await;
        if ended.is_superset(&want) && jobs == 0 && leased == 0 {
            Ok((done, dead.into_iter().collect::<HashSet<i64>>()))
        } else {
            Err(format!(
                "{} of {N} ended; {jobs} queued, {leased} leased",
                ended.intersection(&want).count()
            ))
        }
    })
    .await;
    w.shutdown().await;
    while let Ok(ev) = events.try_recv() {
        outcomes.insert(ev.id, ev.resolution);
    }
    let dead: HashSet<i64> = client
        .query("SELECT id FROM pgwake.dead_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let effects: HashMap<i32, i64> = client
        .query("SELECT n, count(*) FROM effects GROUP BY n", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let mut kinds: HashMap<&str, usize> = HashMap::new();
    for (n, id) in ids.iter().enumerate() {
        let n = n as i32 + 1;
        let is_done = outcomes.get(id) == Some(&Resolution::Done);
        let is_dead = dead.contains(id);
        assert!(
            is_done != is_dead,
            "job {id}: done {is_done}, dead {is_dead} (cancel said {:?}); exactly one must hold",
            said[id]
        );
        match said[id] {
            CancelOutcome::Cancelled => {
                assert!(is_dead, "job {id} was cancelled while waiting");
                assert!(!effects.contains_key(&n), "job {id} never ran");
            }
            CancelOutcome::Finished => assert!(is_done, "job {id} had finished"),
            CancelOutcome::NotFound => panic!("job {id} exists"),
            CancelOutcome::Requested => {}
            CancelOutcome::Dead => panic!("job {id}: no job here was dead before its cancel"),
        }
        if !lease {
            // tx mode: the handler's write committed with the job, or not at all.
            assert_eq!(
                effects.get(&n).copied().unwrap_or(0),
                is_done as i64,
                "job {id}: effects must match done"
            );
        }
        *kinds.entry(said[id].as_str()).or_default() += 1;
    }
    eprintln!("lease={lease}: cancel results {kinds:?}");
}

#[tokio::test]
async fn a_cancel_racing_tx_claims_never_loses_a_job() {
    a_cancel_racing_claims_never_loses_a_job(false).await;
}

#[tokio::test]
async fn a_cancel_racing_lease_claims_never_loses_a_job() {
    a_cancel_racing_claims_never_loses_a_job(true).await;
}

#[tokio::test]
async fn the_worker_role_may_cancel_and_the_producer_role_may_not() {
    let db = migrated_db().await;
    let c = db.client().await;
    for role in ["cx_producer", "cx_worker"] {
        c.batch_execute(&format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                     CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
                 END IF;
             END $$;
             GRANT CONNECT ON DATABASE {} TO {role};",
            db.name
        ))
        .await
        .unwrap();
    }
    c.batch_execute(
        "SELECT pgwake.grant_producer('cx_producer'); SELECT pgwake.grant_worker('cx_worker');",
    )
    .await
    .unwrap();
    let as_role = |role: &str| {
        let mut cfg = db.config();
        cfg.user(role);
        cfg.password("pw");
        cfg
    };
    let producer = pgwake::connect::connect(&as_role("cx_producer"))
        .await
        .unwrap();
    let id = enqueue(&producer, &NewJob::new("t", serde_json::json!({})))
        .await
        .unwrap();
    let refused = pgwake::cancel(&producer, id).await.unwrap_err();
    assert!(
        refused.to_string().contains("permission denied"),
        "{refused}"
    );
    let worker = pgwake::connect::connect(&as_role("cx_worker"))
        .await
        .unwrap();
    assert_eq!(
        pgwake::cancel(&worker, id).await.unwrap(),
        CancelOutcome::Cancelled
    );
}

#[tokio::test]
async fn a_cancel_outlives_a_worker_that_crashed_before_it_heard_of_it() {
    // Worker A hears nothing (its listener points nowhere, it never polls)
    // and is killed with -9 while the job runs: the server rolls the claim
    // back and the job is queued again, its cancel request with it. Worker
    // B claims it and stops it: the job ends cancelled, its work undone.
    let db = migrated_db().await;
    create_slow_sql_function(&db).await;
    let mut a = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            "slow=sql:slow",
            "--job-timeout",
            "10m",
            "--cancel-poll-interval",
            "1h",
            "--listen-database-url",
            "postgres://nobody@127.0.0.1:1/nowhere",
        ],
    );
    let id = running_tx_job(&db, "crash_tx").await;
    let client = db.client().await;
    assert_eq!(
        pgwake::cancel(&client, id).await.unwrap(),
        CancelOutcome::Requested
    );
    send_signal(&a, libc::SIGKILL);
    let _ = a.wait();
    // A backend inside pg_sleep notices its client is gone only at its
    // statement_timeout; end it as the server eventually would.
    client
        .execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE datname = current_database() AND query LIKE '%\"slow\"(%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    eventually("the claim is rolled back", LONG, || async {
        let n: i64 = db
            // In pg_sleep: the worker's start-up check also runs a statement
            // naming "slow"( (it prepares the call), briefly active.
            .scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%\"slow\"(%' AND state = 'active' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()")
            .await;
        n == 0
    })
    .await;
    let requests: i64 = db
        .scalar("SELECT count(*) FROM pgwake.cancel_requests")
        .await;
    assert_eq!(requests, 1, "the request outlived the worker");

    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(600),
            poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler("slow", SqlHandler::parse("slow").unwrap())
        .build()
        .unwrap();
    let mut b = Running::start(worker);
    let ev = b.next_events(1, LONG, |e| e.id == id).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Cancelled);
    assert_tx_cancelled(&db, id).await;
    b.shutdown().await;
}

/// A cancelled lease-mode job reaches `dead_jobs` only once its run has
/// stopped. It used to be moved there by `pgwake.cancel()` itself, while
/// its process still ran until the worker heard of the cancel: an operator
/// who retried it at once (`pgwake dead retry`) started a second run beside
/// the first. Here the worker is stopped (SIGSTOP) while the cancel is
/// sent, so it cannot hear of it until it is continued.
#[tokio::test]
async fn a_cancelled_lease_job_is_in_dead_jobs_only_after_its_process_is_gone() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let handler = format!("sleeper=exec:{}", sleeper_command(dir.path()));
    let mut worker = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--job-timeout",
            "10m",
            "--cancel-poll-interval",
            "200ms",
        ],
    );
    let (id, pid) = running_lease_job(&db, dir.path(), "cancel_stopped").await;
    send_signal(&worker, libc::SIGSTOP);
    let client = db.client().await;
    assert_eq!(
        pgwake::cancel(&client, id).await.unwrap(),
        CancelOutcome::Requested
    );
    let (waiting, leased): (i64, i64) = counts(&db).await;
    assert_eq!((waiting, leased), (0, 1), "still leased: its run goes on");
    let dead: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {id}"
        ))
        .await;
    assert_eq!(dead, 0, "in dead_jobs while its process still runs");
    assert!(!process_dead(pid));
    let retried = pgwake::admin::dead::retry(
        &client,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![id]),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(retried.is_empty(), "a running job cannot be retried");

    send_signal(&worker, libc::SIGCONT);
    // The first moment it is in dead_jobs, its process is gone.
    let alive_when_buried = wait_for("the job in dead_jobs", LONG, async || {
        let dead: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {id}"
            ))
            .await;
        match dead {
            1 => Ok(!process_dead(pid)),
            _ => Err("not in dead_jobs yet".to_string()),
        }
    })
    .await;
    assert!(
        !alive_when_buried,
        "in dead_jobs while its process still ran"
    );
    assert_lease_cancelled(&db, id, pid).await;
    send_signal(&worker, libc::SIGTERM);
    let _ = worker.wait();
}

/// The worker running a lease-mode job is killed (-9) before it hears of
/// the job's cancel: nobody stops the run, and the lease expires. The
/// rescuer buries the job as cancelled instead of queueing it again.
#[tokio::test]
async fn a_cancelled_lease_job_whose_worker_died_is_buried_cancelled_by_the_rescuer() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let handler = format!("sleeper=exec:{}", sleeper_command(dir.path()));
    let mut dying = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--job-timeout",
            "10m",
            "--lease-duration",
            "1s",
            "--cancel-poll-interval",
            "1h",
            "--listen-database-url",
            "postgres://nobody@127.0.0.1:1/nowhere",
        ],
    );
    let (id, pid) = running_lease_job(&db, dir.path(), "cancel_orphan").await;
    send_signal(&dying, libc::SIGKILL);
    let _ = dying.wait();
    eventually("the run dies with its worker", LONG, || async {
        process_dead(pid)
    })
    .await;
    let client = db.client().await;
    assert_eq!(
        pgwake::cancel(&client, id).await.unwrap(),
        CancelOutcome::Requested
    );
    assert_eq!(counts(&db).await, (0, 1), "leased until the lease expires");

    // Another worker's rescuer finds the expired lease.
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            rescue_interval: Duration::from_millis(100),
            ..test_config()
        })
        .handler("sleeper", sleeper(dir.path()))
        .build()
        .unwrap();
    let w = Running::start(worker);
    eventually("the job is buried", LONG, || async {
        counts(&db).await == (0, 0)
    })
    .await;
    w.shutdown().await;
    assert_eq!(dead_reason(&client, id).await, "cancelled");
    let last = std::fs::read_to_string(dir.path().join(format!("{id}.pid"))).unwrap();
    assert_eq!(last.trim(), pid.to_string(), "it never ran again");
}

/// A notification is a hint, never an authority: `NOTIFY pgwake_control,
/// 'cancel <id>'` from a role with no grant at all (anyone who can connect
/// may NOTIFY) must not stop a running job; only a cancel request row,
/// which needs the worker's grant, does. The forged notification for job A
/// goes out before a real cancel of job B; notifications arrive in order, so
/// once B is stopped the worker has acted on both, and A must still run.
async fn a_forged_cancel_notification_stops_nothing(lease: bool) {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let c = db.client().await;
    c.batch_execute(&format!(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cx_nobody') THEN
                 CREATE ROLE cx_nobody LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
             END IF;
         END $$;
         GRANT CONNECT ON DATABASE {} TO cx_nobody;",
        db.name
    ))
    .await
    .unwrap();
    let task = if lease { "sleeper" } else { "slow" };
    let builder = Worker::builder(db.config()).config(WorkerConfig {
        job_timeout: Duration::from_secs(600),
        batch: 1,
        // Only the notification's prompt can deliver the real cancel in time.
        cancel_poll_interval: Duration::from_secs(3600),
        ..test_config()
    });
    let builder = if lease {
        builder.handler(task, sleeper(dir.path()))
    } else {
        create_slow_sql_function(&db).await;
        builder.handler(task, SqlHandler::parse("slow").unwrap())
    };
    let mut w = Running::start(builder.build().unwrap());
    w.until_listening().await;
    let mut ids = Vec::new();
    for n in 1..=2 {
        ids.push(
            enqueue(&c, &NewJob::new(task, serde_json::json!({"n": n})))
                .await
                .unwrap(),
        );
    }
    let (a, b) = (ids[0], ids[1]);
    eventually("both jobs run", LONG, || async {
        if lease {
            ids.iter()
                .all(|id| dir.path().join(format!("{id}.pid")).exists())
        } else {
            let n: i64 = db
                .scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%\"slow\"(%' AND state = 'active' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()")
                .await;
            n == 2
        }
    })
    .await;

    let mut nobody = db.config();
    nobody.user("cx_nobody");
    nobody.password("pw");
    let nobody = pgwake::connect::connect(&nobody).await.unwrap();
    nobody
        .batch_execute(&format!("NOTIFY pgwake_control, 'cancel {a}'"))
        .await
        .unwrap();
    assert_eq!(
        pgwake::cancel(&c, b).await.unwrap(),
        CancelOutcome::Requested
    );
    let ev = w.next_events(1, LONG, |e| e.id == b).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Cancelled);

    let dead_a: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {a}"
        ))
        .await;
    assert_eq!(dead_a, 0, "the forged notification cancelled job {a}");
    if lease {
        let leased: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM pgwake.leased_jobs WHERE id = {a}"
            ))
            .await;
        assert_eq!(leased, 1, "job {a} still holds its lease");
    } else {
        let n: i64 = db
            .scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query LIKE '%\"slow\"(%' AND state = 'active' AND wait_event = 'PgSleep' AND pid <> pg_backend_pid()")
            .await;
        assert_eq!(n, 1, "job {a} still runs");
    }
    // A real cancel still stops it.
    pgwake::cancel(&c, a).await.unwrap();
    let ev = w.next_events(1, LONG, |e| e.id == a).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Cancelled);
    w.shutdown().await;
}

#[tokio::test]
async fn a_forged_cancel_notification_stops_no_tx_job() {
    a_forged_cancel_notification_stops_nothing(false).await;
}

#[tokio::test]
async fn a_forged_cancel_notification_stops_no_lease_job() {
    a_forged_cancel_notification_stops_nothing(true).await;
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

/// Records that it ran.
struct Started(std::sync::Arc<std::sync::atomic::AtomicBool>);

#[async_trait]
impl Handler for Started {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Outcome::Done)
    }
}

/// A job waiting in a lease worker's prefetch buffer is leased, so its
/// cancel is a request: the worker sees it (the job is in its cancel book
/// from claim time) and buries the job as cancelled at once, never run,
/// while the slot is still busy.
#[tokio::test]
async fn a_prefetched_lease_job_is_cancelled_without_running() {
    let db = migrated_db().await;
    let client = db.client().await;
    let gate = enqueue(&client, &NewJob::new("gate", serde_json::json!({})))
        .await
        .unwrap();
    let buffered = enqueue(&client, &NewJob::new("quick", serde_json::json!({})))
        .await
        .unwrap();
    let (open, gate_rx) = tokio::sync::watch::channel(false);
    let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 1,
            prefetch: Some(1),
            lease_queues: vec!["default".into()],
            // The gate never times out: only the cancel can end the
            // buffered job while the slot is busy.
            job_timeout: Duration::from_secs(3600),
            ..test_config()
        })
        .handler("gate", Gate(gate_rx))
        .handler("quick", Started(ran.clone()))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    eventually("one job running, one buffered", LONG, || async {
        counts(&db).await == (0, 2)
    })
    .await;
    assert_eq!(
        pgwake::cancel(&client, buffered).await.unwrap(),
        CancelOutcome::Requested,
        "a buffered job is leased: its cancel is a request"
    );
    let ev = w.next_events(1, LONG, |e| e.id == buffered).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Cancelled);
    assert_eq!(dead_reason(&client, buffered).await, "cancelled");
    open.send(true).unwrap();
    let ev = w.next_events(1, LONG, |e| e.id == gate).await.remove(0);
    assert_eq!(ev.resolution, Resolution::Done);
    w.shutdown().await;
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the cancelled job never ran"
    );
    assert_eq!(counts(&db).await, (0, 0));
}
