//! What a batch's fan-in costs (issue 36 item 4, "Done means": the cost of
//! a fan-in of 10,000 parents over one child), on a throwaway PostgreSQL
//! with an in-process worker (no-op Rust handlers, concurrency CONCURRENCY),
//! in each delivery mode:
//!
//! A producer opens a batch, enqueues JOBS jobs into it in transactions of
//! 1,000 (an import's rows in a loop) while the worker drains them, and
//! closes it; the callback runs once the last has ended. Printed: the time
//! to enqueue and close, from the first enqueue to the callback's start,
//! from the last job's end to the callback's start, the drain rate, and the
//! same number of jobs without a batch drained by the same worker.
//!
//! ```text
//! cargo build --release --example batch_bench
//! ./target/release/examples/batch_bench [--jobs 10000] [--concurrency 8] [--mode tx,lease]
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../cli/embedded.rs"]
#[allow(dead_code)]
mod embedded;

use pgwake::client::{batch_close, batch_open, enqueue_many, NewJob, BATCH_CLOSE_WITHIN_DEFAULT};
use pgwake::{async_trait, BoxError, Delivery, Job, JobContext, Outcome, Worker, WorkerConfig};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The last job's end, the callback's start, how many jobs ended.
#[derive(Default)]
struct Times {
    last_end: Mutex<Option<Instant>>,
    callback: Mutex<Option<Instant>>,
    ended: AtomicUsize,
    done: tokio::sync::Notify,
}

/// `job`: a batch's job (or a plain one), records its end. `report`: the
/// callback, records its start.
struct Timed {
    delivery: Delivery,
    times: Arc<Times>,
}

#[async_trait]
impl pgwake::Handler for Timed {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if job.task == "report" {
            *self.times.callback.lock().unwrap() = Some(Instant::now());
        } else {
            *self.times.last_end.lock().unwrap() = Some(Instant::now());
            self.times.ended.fetch_add(1, Ordering::SeqCst);
        }
        self.times.done.notify_waiters();
        Ok(Outcome::Done)
    }
}

impl Times {
    /// Wait until `cond` holds (saying what is left every minute).
    async fn until(&self, what: &str, c: &tokio_postgres::Client, cond: impl Fn(&Times) -> bool) {
        let mut since = Instant::now();
        loop {
            let notified = self.done.notified();
            if cond(self) {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            if since.elapsed() > Duration::from_secs(60) {
                since = Instant::now();
                let r = c
                    .query_one(
                        "SELECT (SELECT count(*) FROM pgwake.jobs), (SELECT count(*) FROM pgwake.leased_jobs)",
                        &[],
                    )
                    .await
                    .unwrap();
                eprintln!(
                    "waiting for {what}: {} ended; jobs {}, leased {}",
                    self.ended.load(Ordering::SeqCst),
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1)
                );
            }
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn run(url: &str, delivery: Delivery, jobs: usize, concurrency: usize) {
    let db = pgwake::connect::parse_url(url).unwrap();
    let mut c = pgwake::connect::connect(&db).await.unwrap();
    let times = Arc::new(Times::default());
    let mut builder = Worker::builder(db.clone()).config(WorkerConfig {
        concurrency,
        sample_interval: None,
        rollup: None,
        ..WorkerConfig::default()
    });
    for task in ["job", "report"] {
        builder = builder.handler(
            task,
            Timed {
                delivery,
                times: times.clone(),
            },
        );
    }
    let worker = builder.build().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let abort = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    let mode = delivery.as_str();

    // Without a batch: the same jobs, for the drain rate.
    let started = Instant::now();
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<NewJob> = chunk
            .iter()
            .map(|_| NewJob::new("job", serde_json::json!({})))
            .collect();
        let tx = c.transaction().await.unwrap();
        enqueue_many(&tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    times
        .until("the plain jobs", &c, |t| {
            t.ended.load(Ordering::SeqCst) >= jobs
        })
        .await;
    let plain = started.elapsed();
    times.ended.store(0, Ordering::SeqCst);

    // The batch: opened, filled 1,000 jobs a transaction while the worker
    // drains them, closed.
    let started = Instant::now();
    let b = batch_open(
        &c,
        "report",
        &serde_json::json!({}),
        None,
        BATCH_CLOSE_WITHIN_DEFAULT,
    )
    .await
    .unwrap();
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(1000) {
        let batch: Vec<NewJob> = chunk
            .iter()
            .map(|_| NewJob::new("job", serde_json::json!({})).batch(b))
            .collect();
        let tx = c.transaction().await.unwrap();
        enqueue_many(&tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    batch_close(&c, b).await.unwrap();
    let enqueued = started.elapsed();
    times
        .until("the callback", &c, |t| t.callback.lock().unwrap().is_some())
        .await;
    let callback = times.callback.lock().unwrap().unwrap();
    let last_end = times.last_end.lock().unwrap().unwrap();
    let ended = times.ended.load(Ordering::SeqCst);
    assert_eq!(ended, jobs, "every job ran before the callback");
    println!(
        "{mode}: batch of {jobs} → 1 callback: enqueued and closed in {:.0} ms; first enqueue → callback's start {:.0} ms ({:.0} jobs/s); last job's end → callback's start {:.1} ms; {jobs} jobs without a batch: {:.0} ms ({:.0} jobs/s)",
        ms(enqueued),
        ms(callback - started),
        jobs as f64 / (callback - started).as_secs_f64(),
        ms(callback.saturating_duration_since(last_end)),
        ms(plain),
        jobs as f64 / plain.as_secs_f64(),
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = arg(&args, "--jobs", 10_000);
    let concurrency: usize = arg(&args, "--concurrency", 8);
    let cluster = tokio::task::spawn_blocking(embedded::Cluster::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let url = cluster.url("postgres");
    {
        let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&url).unwrap())
            .await
            .unwrap();
        pgwake::admin::schema::migrate(&mut c)
            .await
            .expect("migrate");
    }
    println!(
        "machine: {} cores; {jobs} jobs per batch, concurrency {concurrency}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let modes: String = arg(&args, "--mode", "tx,lease".to_string());
    for mode in modes.split(',') {
        match mode {
            "tx" => run(&url, Delivery::Tx, jobs, concurrency).await,
            "lease" => run(&url, Delivery::Lease, jobs, concurrency).await,
            other => panic!("--mode {other:?}: give tx, lease or tx,lease"),
        }
    }
    drop(cluster);
}
