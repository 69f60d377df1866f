//! The per-minute rollup (issue 38, item 2): a real worker counts each
//! run's outcome per queue, task and outcome and adds the counts into
//! `pgwake.minute_stats`, in both delivery modes, with full history off;
//! `pgwake stats` reads them; a worker killed with SIGKILL keeps what it
//! flushed and several workers add into the same rows; a worker with the
//! rollup off counts nothing.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::config::RollupConfig;
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// `{"fail": true}` fails for good; `{"retry_once": true}` fails its first
/// attempt and is done on the second; anything else is done.
struct Mix;

#[async_trait]
impl Handler for Mix {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if job.payload["fail"] == json!(true) {
            return Ok(Outcome::fail("told to fail"));
        }
        if job.payload["retry_once"] == json!(true) && job.attempt == 1 {
            return Ok(Outcome::retry_after("first attempt", Duration::ZERO));
        }
        Ok(Outcome::Done)
    }
}

fn worker(db: &TestDb, config: WorkerConfig) -> Worker {
    Worker::builder(db.config())
        .config(config)
        .handler("mix", Mix)
        .build()
        .unwrap()
}

/// The rollup on, flushed only at shutdown (a minute apart), `lq` in
/// lease mode, the rest in tx mode.
fn rollup_config() -> WorkerConfig {
    WorkerConfig {
        rollup: Some(RollupConfig {
            flush_interval: Duration::from_secs(60),
            ..RollupConfig::default()
        }),
        lease_queues: vec!["lq".into()],
        ..test_config()
    }
}

/// Per queue: 4 done, 3 retried once then done, 2 dead; 14 runs.
async fn enqueue_mix(client: &tokio_postgres::Client, queue: &str) {
    let payloads = std::iter::repeat_n(json!({}), 4)
        .chain(std::iter::repeat_n(json!({"retry_once": true}), 3))
        .chain(std::iter::repeat_n(json!({"fail": true}), 2));
    for p in payloads {
        enqueue(client, &NewJob::new("mix", p).queue(queue))
            .await
            .unwrap();
    }
}

/// `(queue, task, outcome, jobs, pickup mean ≥ 0)` rows, summed over
/// minutes.
async fn counted(client: &tokio_postgres::Client) -> Vec<(String, String, String, i64)> {
    client
        .query(
            "SELECT queue, task, outcome, sum(jobs)::int8 FROM pgwake.minute_stats \
             GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

fn expected(queue: &str) -> Vec<(String, String, String, i64)> {
    [("dead", 2), ("done", 7), ("retry", 3)]
        .into_iter()
        .map(|(o, n)| (queue.to_string(), "mix".to_string(), o.to_string(), n))
        .collect()
}

#[tokio::test]
async fn the_rollup_counts_done_retried_and_dead_runs_of_a_real_worker_in_both_modes() {
    let db = migrated_db().await;
    let client = db.client().await;
    enqueue_mix(&client, "lq").await;
    enqueue_mix(&client, "tq").await;
    let mut w = Running::start(worker(&db, rollup_config()));
    // 2 queues × (9 first runs + 3 second runs).
    w.next_events(24, WAIT, |e| e.outcome() != "returned").await;
    // Shutdown flushes what the worker counted since (its interval is a
    // minute: this flush is the only one).
    w.shutdown().await;
    let mut want = expected("lq");
    want.extend(expected("tq"));
    assert_eq!(counted(&client).await, want);
    let history: i64 = db.scalar("SELECT count(*) FROM pgwake.finished_jobs").await;
    assert_eq!(history, 0, "full history stays off");
    let pickup_ok: bool = db
        .scalar(
            "SELECT bool_and(pickup_seconds_sum >= 0 AND pickup_seconds_max >= 0 \
             AND pickup_seconds_max <= pickup_seconds_sum) FROM pgwake.minute_stats",
        )
        .await;
    assert!(pickup_ok, "pickup latency aggregates are consistent");

    // `pgwake stats` shows them per queue over the last hour.
    let out = run_pgwake(&["stats", "--json"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for q in ["lq", "tq"] {
        let s = stats
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["queue"] == q)
            .unwrap_or_else(|| panic!("queue {q} in {stats}"));
        assert_eq!(s["recent"]["done"], 7, "{s}");
        assert_eq!(s["recent"]["retried"], 3, "{s}");
        assert_eq!(s["recent"]["dead"], 2, "{s}");
        assert_eq!(s["recent"]["window_seconds"], 3600.0, "{s}");
        assert!(
            s["recent"]["jobs_per_second"].as_f64().unwrap() > 0.0,
            "{s}"
        );
    }
    let out = run_pgwake(&["stats", "--since", "10m"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("Ran in the last 10m"), "{table}");
    let line = table
        .lines()
        .skip_while(|l| !l.starts_with("Ran in the last"))
        .find(|l| l.starts_with("lq "))
        .unwrap_or_else(|| panic!("{table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[..4], ["lq", "7", "3", "2"], "{table}");
}

#[tokio::test]
async fn a_worker_with_the_rollup_off_counts_nothing() {
    let db = migrated_db().await;
    let client = db.client().await;
    enqueue_mix(&client, "tq").await;
    let mut w = Running::start(worker(
        &db,
        WorkerConfig {
            rollup: None,
            ..rollup_config()
        },
    ));
    w.next_events(12, WAIT, |e| e.outcome() != "returned").await;
    w.shutdown().await;
    assert_eq!(counted(&client).await, vec![]);
}

#[tokio::test]
async fn stats_refuses_a_window_out_of_bounds_naming_the_flag() {
    let db = migrated_db().await;
    for bad in ["10s", "30d"] {
        let out = run_pgwake(&["stats", "--since", bad], Some(&db.url));
        assert!(!out.status.success());
        let err = stderr_of(&out);
        assert!(err.contains("--since must be between 1m and 7d"), "{err}");
    }
}

/// Counted runs of `task`, every outcome.
async fn counted_of(db: &TestDb, task: &str) -> i64 {
    db.scalar(&format!(
        "SELECT coalesce(sum(jobs), 0)::int8 FROM pgwake.minute_stats WHERE task = '{task}'"
    ))
    .await
}

/// Jobs waiting or leased.
async fn unfinished(db: &TestDb) -> i64 {
    db.scalar(
        "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)",
    )
    .await
}

async fn enqueue_t(client: &tokio_postgres::Client, n: usize) {
    for _ in 0..n {
        enqueue(client, &NewJob::new("t", json!({}))).await.unwrap();
    }
}

#[tokio::test]
async fn a_killed_worker_loses_at_most_its_unflushed_counts_and_workers_add_up() {
    let db = migrated_db().await;
    let client = db.client().await;
    // A worker that flushes every 100 ms: once all 20 are counted in the
    // database (the event awaited), SIGKILL loses none of them.
    enqueue_t(&client, 20).await;
    let fast = [
        "--handler",
        "t=exec:true",
        "--stats-flush-interval",
        "100ms",
    ];
    let mut first = KillOnDrop::new(spawn_pgwake_run(&db.url, &fast));
    eventually("20 runs flushed", WAIT, || async {
        counted_of(&db, "t").await == 20
    })
    .await;
    send_signal(first.child(), libc::SIGKILL);
    let _ = first.take().wait();
    assert_eq!(
        counted_of(&db, "t").await,
        20,
        "flushed counts survive SIGKILL"
    );

    // A worker that would flush only after an hour: SIGKILL loses its
    // unflushed counts (the jobs themselves are done), nothing more.
    enqueue_t(&client, 5).await;
    let slow = ["--handler", "t=exec:true", "--stats-flush-interval", "1h"];
    let mut second = KillOnDrop::new(spawn_pgwake_run(&db.url, &slow));
    eventually("5 more jobs done", WAIT, || async {
        unfinished(&db).await == 0
    })
    .await;
    send_signal(second.child(), libc::SIGKILL);
    let _ = second.take().wait();
    assert_eq!(
        counted_of(&db, "t").await,
        20,
        "the killed worker's unflushed counts are lost"
    );

    // The same worker stopped cleanly flushes its last counts, adding to
    // what the others wrote.
    enqueue_t(&client, 5).await;
    let mut third = KillOnDrop::new(spawn_pgwake_run(&db.url, &slow));
    eventually("5 more jobs done", WAIT, || async {
        unfinished(&db).await == 0
    })
    .await;
    send_signal(third.child(), libc::SIGTERM);
    let out = wait_exit(third.take(), WAIT).await;
    assert!(out.status.success(), "{}", stderr_of(&out));
    assert_eq!(counted_of(&db, "t").await, 25);
}
