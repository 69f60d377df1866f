//! `pgwake.queue_pressure` (functions/queue_pressure.sql), the autoscaling
//! signal: runnable jobs are those a worker could start now (ready, not
//! paused, within max_running and the free rate admissions), ready jobs are
//! counted up to a cap and say so, jobs in flight count in both delivery
//! modes, and only producers, monitors and workers may call it.

use crate::common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::admin::queue_pressure::{self, QueuePressure};
use pgwake::{async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome};
use tokio::sync::watch;

const WAIT: Duration = Duration::from_secs(60);

async fn pressure(c: &tokio_postgres::Client, queue: &str) -> QueuePressure {
    let mut rows = queue_pressure::read(c, Some(queue), queue_pressure::CAP_DEFAULT)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "one row for one queue: {rows:?}");
    rows.remove(0)
}

/// (runnable, ready, running, paused, capped)
fn counts(p: &QueuePressure) -> (i64, i64, i64, bool, bool) {
    (p.runnable, p.ready, p.running, p.paused, p.capped)
}

/// Ready jobs count; jobs scheduled for later, held behind their ordering
/// key, or in another queue do not; leased jobs and a running tx-mode claim
/// (its batch mark written, as the worker writes it) are running, not
/// ready, and a claim that rolled back gives its job back; max_running,
/// the rate's free admissions and a pause cut what is runnable; an unknown
/// queue is one row of zeros.
///
/// Teeth: without the tx batch marks' jobs taken off (`tx_ids` empty),
/// ready stays 5 while the tx claim runs; without the max_running cut, or
/// without the rate's, runnable stays at ready; without `run_at <= now()`
/// the jobs scheduled for later count.
#[tokio::test]
async fn queue_pressure_counts_what_a_worker_could_start_now() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task, run_at, created_at)
             VALUES ('q', 'oldest', now() - interval '100 s', now() - interval '100 s');
         INSERT INTO pgwake.jobs (queue, task) SELECT 'q', 't' FROM generate_series(1, 5);
         INSERT INTO pgwake.jobs (queue, task, run_at)
             SELECT 'q', 'later', now() + interval '1 hour' FROM generate_series(1, 3);
         -- the key's second job is held behind its first
         INSERT INTO pgwake.jobs (queue, task, ordering_key) VALUES ('q', 'k', 'key');
         INSERT INTO pgwake.jobs (queue, task, ordering_key) VALUES ('q', 'k', 'key');
         INSERT INTO pgwake.jobs (queue, task) SELECT 'other', 't' FROM generate_series(1, 4);",
    )
    .await
    .unwrap();
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (7, 7, 0, false, false), "{p:?}");
    assert!(
        (100.0..1000.0).contains(&p.oldest_ready_age_seconds),
        "the oldest ready job has waited 100 s: {p:?}"
    );

    // Two leased jobs (the oldest among them).
    let leased = c
        .query(
            "SELECT id FROM pgwake.claim_lease_queue(2, 'q', NULL, '{}', 'w1', 60)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 2);
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (5, 5, 2, false, false), "{p:?}");
    assert!(
        p.oldest_ready_age_seconds < 100.0,
        "the 100 s old job is leased, not ready: {p:?}"
    );

    // A tx-mode claim of one job, marked as the worker marks its batches
    // (src/db/sql/batch_mark.sql, on another connection).
    let claimer = db.client().await;
    claimer.batch_execute("BEGIN").await.unwrap();
    let claimed = claimer
        .query(
            "SELECT id FROM pgwake.claim_tx_queue(1, 'q', NULL, '{}')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let id: i64 = claimed[0].get(0);
    let xid: String = claimer
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    c.execute(
        "INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id) VALUES ($1::text::xid8, $2, 'w2')",
        &[&xid, &vec![id]],
    )
    .await
    .unwrap();
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (4, 4, 3, false, false), "{p:?}");

    // Limits: 3 running of at most 5 leave 2 slots; 3 of at most 2, none.
    pgwake::admin::queues::set_max_running(&c, "q", Some(5))
        .await
        .unwrap();
    assert_eq!(counts(&pressure(&c, "q").await), (2, 4, 3, false, false));
    pgwake::admin::queues::set_max_running(&c, "q", Some(2))
        .await
        .unwrap();
    assert_eq!(counts(&pressure(&c, "q").await), (0, 4, 3, false, false));
    pgwake::admin::queues::set_max_running(&c, "q", None)
        .await
        .unwrap();

    // The claim rolls back: its job is ready again, its mark names an
    // aborted transaction.
    claimer.batch_execute("ROLLBACK").await.unwrap();
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (5, 5, 2, false, false), "{p:?}");

    // A rate of 3 an hour: 3 admissions free, then one taken.
    c.batch_execute("SELECT pgwake.set_queue_rate('q', 3, '1 hour')")
        .await
        .unwrap();
    assert_eq!(counts(&pressure(&c, "q").await), (3, 5, 2, false, false));
    c.batch_execute(
        "UPDATE pgwake.queue_rate_slots SET last_start = now() WHERE queue = 'q' AND slot = 1",
    )
    .await
    .unwrap();
    assert_eq!(counts(&pressure(&c, "q").await), (2, 5, 2, false, false));
    c.batch_execute("SELECT pgwake.set_queue_rate('q', NULL)")
        .await
        .unwrap();

    // Paused: nothing is runnable; the ready jobs and their age stay.
    pgwake::admin::queues::pause(&c, "q").await.unwrap();
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (0, 5, 2, true, false), "{p:?}");
    assert!(p.oldest_ready_age_seconds > 0.0, "{p:?}");
    pgwake::admin::queues::resume(&c, "q").await.unwrap();

    let p = pressure(&c, "nope").await;
    assert_eq!(counts(&p), (0, 0, 0, false, false), "{p:?}");
    assert_eq!(p.oldest_ready_age_seconds, 0.0);

    // Every queue: those with jobs or settings, by name.
    let all = queue_pressure::read(&c, None, queue_pressure::CAP_DEFAULT)
        .await
        .unwrap();
    let all: Vec<(String, i64, i64)> = all
        .iter()
        .map(|p| (p.queue.clone(), p.runnable, p.running))
        .collect();
    assert_eq!(
        all,
        vec![("other".to_string(), 4, 0), ("q".to_string(), 5, 2)]
    );
}

/// More ready jobs than the cap: ready and runnable are the cap, and
/// `capped` says there are at least that many; jobs scheduled for later in
/// front of them in the index are not counted; at most 1,000 priorities are
/// walked, and a queue with more says capped.
///
/// Teeth: with `capped` never set from the count, the first reads fail;
/// without `run_at <= now()` in the count the 100 jobs scheduled for later
/// count; without the bound of priorities all 1,001 count.
/// Under a held vacuum horizon the head of a queue's range of the claim
/// index holds an entry for every job claimed since, a heap visit each for
/// every read that starts there. A call reads each priority's range from
/// the first job its probe found: one walk of those entries, about the
/// buffers of one walk. It read the range from its first entry three times
/// (the probe, the ready count, the oldest job): three times the buffers,
/// 64-108 ms a call 2.3 minutes into a pin at 1,500 jobs/s, for a producer
/// that calls it every 200 ms. The answer is the live jobs'. The claimed
/// jobs were due before the waiting ones, as claims take them.
#[tokio::test]
async fn under_a_held_horizon_a_call_walks_the_claimed_jobs_entries_once() {
    let db = migrated_db().await;
    let c = db.client().await;
    let _pin = hold_horizon(&db, "pinning-session").await;
    leave_claimed_jobs(&c, 20_000, "now() - interval '2 minutes'").await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (task, run_at, created_at)
             SELECT 't', now() - interval '1 minute', now() - interval '1 minute' FROM generate_series(1, 10);
         INSERT INTO pgwake.jobs (task, priority, run_at) VALUES ('t', 5, now()), ('t', 5, now()), ('t', 0, now() + interval '1 hour');
         ANALYZE pgwake.jobs;",
    )
    .await
    .unwrap();
    let p = pressure(&c, "default").await;
    assert_eq!(counts(&p), (12, 12, 0, false, false));
    assert!(
        p.oldest_ready_age_seconds >= 59.0,
        "{}",
        p.oldest_ready_age_seconds
    );
    // The session's first call (above) reads the catalogs and plans; the
    // calls after it are what a producer's loop pays. Their plans are
    // generic from the first call (not made for the call's values, whose
    // estimates read the ends of the index, dead entries and all: 2.6x one
    // walk in a session's first five calls).
    assert_walks_once(
        &c,
        "SELECT id FROM pgwake.jobs WHERE queue = 'default' AND NOT held ORDER BY queue, priority, run_at, id LIMIT 1",
        "SELECT * FROM pgwake.queue_pressure('default')",
        "a call",
    )
    .await;
}

/// Beside a deeper queue that sorts after it, a call counts through the
/// index: a bounded number of buffers, not a scan of the table. A version
/// that compared the whole index key as one row, `(queue, priority, run_at,
/// id) >= (…)`, was estimated by its first column alone (`queue >= 'q'`:
/// the later queue's jobs too) and counted with a sequential scan, through
/// the other queue's rows first (at a million waiting jobs, 3.6–3.9 ms a
/// call instead of 0.9–1.3).
#[tokio::test]
async fn a_call_counts_through_the_index_beside_a_deeper_later_queue() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task) SELECT 'z', 't' FROM generate_series(1, 100000);
         INSERT INTO pgwake.jobs (queue, task) SELECT 'q', 't' FROM generate_series(1, 2000);",
    )
    .await
    .unwrap();
    c.batch_execute("VACUUM ANALYZE pgwake.jobs").await.unwrap();
    let pages: i64 = c
        .query_one(
            "SELECT pg_relation_size('pgwake.jobs') / current_setting('block_size')::int8",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let cap = 1000;
    for _ in 0..6 {
        let rows = queue_pressure::read(&c, Some("q"), cap).await.unwrap();
        assert_eq!((rows[0].ready, rows[0].capped), (1000, true));
    }
    let call = buffers_read(&c, "SELECT * FROM pgwake.queue_pressure('q', 1000)").await;
    eprintln!("the table: {pages} pages; a call: {call} buffers");
    assert!(
        call * 10 < pages,
        "the count goes through the index: {call} buffers, the table has {pages} pages"
    );
}

#[tokio::test]
async fn queue_pressure_stops_counting_at_the_cap_and_says_so() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task, priority, run_at)
             SELECT 'q', 'later', 0, now() + interval '1 hour' FROM generate_series(1, 100);
         INSERT INTO pgwake.jobs (queue, task, priority) SELECT 'q', 't', i % 3 FROM generate_series(1, 30) i;",
    )
    .await
    .unwrap();
    let read = |cap: i32| {
        let c = &c;
        async move {
            let rows = queue_pressure::read(c, Some("q"), cap).await.unwrap();
            counts(&rows[0])
        }
    };
    assert_eq!(read(10).await, (10, 10, 0, false, true));
    assert_eq!(read(30).await, (30, 30, 0, false, true));
    assert_eq!(read(31).await, (30, 30, 0, false, false));
    // Through SQL as KEDA's trigger sends it: the default cap.
    let demand: i64 = c
        .query_one(
            "SELECT running + runnable FROM pgwake.queue_pressure('q')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(demand, 30);
    for cap in [0, 1_000_001] {
        let e = queue_pressure::read(&c, Some("q"), cap).await.unwrap_err();
        assert!(e.to_string().contains("cap"), "{e}");
        let e = c
            .query_one("SELECT * FROM pgwake.queue_pressure('q', $1)", &[&cap])
            .await
            .unwrap_err();
        let message = e.as_db_error().map(|d| d.message()).unwrap_or_default();
        assert!(message.contains("cap must be between"), "{e:?}");
    }

    // 1,001 priorities with a ready job each: the first 1,000 count.
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task, priority) SELECT 'p', 't', i FROM generate_series(1, 1001) i",
    )
    .await
    .unwrap();
    let p = &queue_pressure::read(&c, Some("p"), 10_000).await.unwrap()[0];
    assert_eq!(counts(p), (1000, 1000, 0, false, true), "{p:?}");
    c.batch_execute("DELETE FROM pgwake.jobs WHERE queue = 'p' AND priority = 1001")
        .await
        .unwrap();
    let p = &queue_pressure::read(&c, Some("p"), 10_000).await.unwrap()[0];
    assert_eq!(counts(p), (1000, 1000, 0, false, false), "{p:?}");
}

/// A producer and a monitor may call it (the producer, who cannot read
/// the lease table, still gets the running count); a role with only the
/// schema's USAGE (what PUBLIC has) is refused.
///
/// Teeth: without the grants in functions/roles.sql the producer and the
/// monitor are refused; without `SECURITY DEFINER` the producer is refused
/// (it reads pgwake.tx_batches and pgwake.queues through the function).
#[tokio::test]
async fn queue_pressure_is_for_producers_and_monitors_not_public() {
    let db = migrated_db().await;
    let c = db.client().await;
    for role in ["qp_producer", "qp_monitor", "qp_nobody"] {
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
        "SELECT pgwake.grant_producer('qp_producer');
         SELECT pgwake.grant_monitor('qp_monitor');
         GRANT USAGE ON SCHEMA pgwake TO qp_nobody;
         INSERT INTO pgwake.jobs (queue, task) SELECT 'q', 't' FROM generate_series(1, 3);",
    )
    .await
    .unwrap();
    c.query(
        "SELECT id FROM pgwake.claim_lease_queue(1, 'q', NULL, '{}', 'w1', 60)",
        &[],
    )
    .await
    .unwrap();
    let as_role = |role: &str| {
        let mut cfg = db.config();
        cfg.user(role);
        cfg.password("pw");
        cfg
    };
    for role in ["qp_producer", "qp_monitor"] {
        let rc = pgwake::connect::connect(&as_role(role)).await.unwrap();
        let p = pressure(&rc, "q").await;
        assert_eq!(counts(&p), (2, 2, 1, false, false), "{role}: {p:?}");
        let e = rc
            .query("SELECT * FROM pgwake.leased_jobs", &[])
            .await
            .err();
        if role == "qp_producer" {
            assert!(e.is_some(), "a producer does not read the lease table");
        }
    }
    let nobody = pgwake::connect::connect(&as_role("qp_nobody"))
        .await
        .unwrap();
    let e = nobody
        .query("SELECT * FROM pgwake.queue_pressure('q')", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("42501"), "{e}");
}

/// Runs until the test releases it.
struct Held {
    delivery: Delivery,
    running: Arc<AtomicUsize>,
    release: watch::Receiver<HashSet<i64>>,
}

#[async_trait]
impl Handler for Held {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        self.running.fetch_add(1, Ordering::SeqCst);
        let mut release = self.release.clone();
        let r = release.wait_for(|set| set.contains(&job.id)).await;
        self.running.fetch_sub(1, Ordering::SeqCst);
        r?;
        Ok(Outcome::Done)
    }
}

/// A real worker running two jobs of five: two running, three ready, in
/// both delivery modes; when they are done, none runs.
///
/// Teeth: in tx mode, without the batch marks' jobs (`tx_ids` empty),
/// running stays 0 and ready 5 while the two run.
async fn a_worker_s_running_jobs_are_running_not_ready(delivery: Delivery) {
    let db = migrated_db().await;
    let c = db.client().await;
    let running = Arc::new(AtomicUsize::new(0));
    let (release, release_rx) = watch::channel(HashSet::new());
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            concurrency: 2,
            batch: 1,
            prefetch: Some(0),
            ..test_config()
        })
        .handler(
            "held",
            Held {
                delivery,
                running: running.clone(),
                release: release_rx,
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let ids: Vec<i64> = c
        .query(
            "INSERT INTO pgwake.jobs (queue, task) SELECT 'q', 'held' FROM generate_series(1, 5) RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let r = running.clone();
    eventually("two jobs run", WAIT, || {
        let r = r.clone();
        async move { r.load(Ordering::SeqCst) == 2 }
    })
    .await;
    // The handlers run once the batch is marked: the mark is there.
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (3, 3, 2, false, false), "{delivery:?}: {p:?}");
    release.send_modify(|set| set.extend(ids.iter().copied()));
    w.next_events(5, WAIT, |_| true).await;
    w.shutdown().await;
    let p = pressure(&c, "q").await;
    assert_eq!(counts(&p), (0, 0, 0, false, false), "{delivery:?}: {p:?}");
}

#[tokio::test]
async fn a_tx_worker_s_running_jobs_are_running_not_ready() {
    a_worker_s_running_jobs_are_running_not_ready(Delivery::Tx).await;
}

#[tokio::test]
async fn a_lease_worker_s_running_jobs_are_running_not_ready() {
    a_worker_s_running_jobs_are_running_not_ready(Delivery::Lease).await;
}

/// `pgwake queue pressure` prints what the function returns: a table with
/// a capped count shown as `N+`, and JSON.
#[tokio::test]
async fn pgwake_queue_pressure_prints_the_function_s_answer() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task) SELECT 'q', 't' FROM generate_series(1, 12)",
    )
    .await
    .unwrap();
    let out = run_pgwake(&["queue", "pressure", "q", "--cap", "10"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    let line = table.lines().nth(1).unwrap_or_default();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(words[..4], ["q", "10+", "10+", "0"], "{table}");
    let out = run_pgwake(&["queue", "pressure", "--json"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["queue"], "q");
    assert_eq!(json[0]["runnable"], 12);
    assert_eq!(json[0]["capped"], false);
}
