//! What dependencies cost (issue 36, "Done means"), on a throwaway
//! PostgreSQL with an in-process worker (no-op Rust handlers, concurrency
//! CONCURRENCY), in each delivery mode:
//!
//! - **release latency**: PAIRS parent → child pairs, one at a time on an
//!   idle worker: from the parent's handler returning (before its commit)
//!   to the child's handler starting — the commit that ends the parent and
//!   releases the child, the wake-up, the claim. p50 and p99.
//! - **fan-out**: one parent, FANOUT children: the time to enqueue the
//!   children (one transaction), from the parent's end to the first and the
//!   last child's start, and the children's drain rate against as many jobs
//!   without parents drained by the same worker.
//! - **fan-in**: 1,000 parents (the most one job may have) over one child,
//!   and 10,000 as a tree (10 jobs of 1,000 parents each, one child over
//!   the 10): the child's enqueue and from the last leaf's end to the
//!   child's start.
//!
//! ```text
//! cargo build --release --example flows_bench
//! ./target/release/examples/flows_bench [--pairs 300] [--fanout 10000] [--concurrency 8]
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../cli/embedded.rs"]
#[allow(dead_code)]
mod embedded;

use pgwake::client::{enqueue, enqueue_many, NewJob};
use pgwake::{async_trait, BoxError, Delivery, Job, JobContext, Outcome, Worker, WorkerConfig};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// When each job's handler ended (parents) or started (children).
#[derive(Default)]
struct Times {
    ended: Mutex<HashMap<i64, Instant>>,
    started: Mutex<HashMap<i64, Instant>>,
    children_done: AtomicUsize,
    done: tokio::sync::Notify,
}

/// `p`: a parent, records its end. `c`: a child, records its start.
struct Timed {
    delivery: Delivery,
    times: Arc<Times>,
    parent: bool,
}

#[async_trait]
impl pgwake::Handler for Timed {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if self.parent {
            self.times
                .ended
                .lock()
                .unwrap()
                .insert(job.id, Instant::now());
        } else {
            self.times
                .started
                .lock()
                .unwrap()
                .insert(job.id, Instant::now());
            self.times.children_done.fetch_add(1, Ordering::SeqCst);
            self.times.done.notify_waiters();
        }
        Ok(Outcome::Done)
    }
}

impl Times {
    /// Wait until `n` children ran in all (saying what is left after a
    /// minute, and every minute).
    async fn children(&self, n: usize, c: &tokio_postgres::Client) {
        let mut since = Instant::now();
        loop {
            let notified = self.done.notified();
            if self.children_done.load(Ordering::SeqCst) >= n {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            if since.elapsed() > Duration::from_secs(60) {
                since = Instant::now();
                let r = c
                    .query_one(
                        "SELECT (SELECT count(*) FROM pgwake.jobs), (SELECT count(*) FROM pgwake.jobs WHERE held), (SELECT count(*) FROM pgwake.leased_jobs)",
                        &[],
                    )
                    .await
                    .unwrap();
                eprintln!(
                    "waiting for {} children ({} so far): jobs {}, held {}, leased {}",
                    n,
                    self.children_done.load(Ordering::SeqCst),
                    r.get::<_, i64>(0),
                    r.get::<_, i64>(1),
                    r.get::<_, i64>(2)
                );
            }
        }
    }

    fn end_of(&self, id: i64) -> Instant {
        self.ended.lock().unwrap()[&id]
    }

    fn start_of(&self, id: i64) -> Instant {
        self.started.lock().unwrap()[&id]
    }
}

/// Make jobs `ids` (enqueued with a delay, so that nothing starts before
/// they are all in) due now, and wake the worker.
async fn due_now(c: &tokio_postgres::Client, ids: &[i64]) {
    c.execute(
        "UPDATE pgwake.jobs SET run_at = now() WHERE id = ANY($1)",
        &[&ids],
    )
    .await
    .unwrap();
    c.execute("SELECT pg_notify('pgwake', 'default')", &[])
        .await
        .unwrap();
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn quantiles(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} pairs)",
        at(0.5),
        at(0.99),
        at(1.0),
        v.len()
    )
}

async fn run(url: &str, delivery: Delivery, pairs: usize, fanout: usize, concurrency: usize) {
    let db = pgwake::connect::parse_url(url).unwrap();
    let mut c = pgwake::connect::connect(&db).await.unwrap();
    let times = Arc::new(Times::default());
    let worker = Worker::builder(db.clone())
        .config(WorkerConfig {
            concurrency,
            sample_interval: None,
            rollup: None,
            ..WorkerConfig::default()
        })
        .handler(
            "p",
            Timed {
                delivery,
                times: times.clone(),
                parent: true,
            },
        )
        .handler(
            "c",
            Timed {
                delivery,
                times: times.clone(),
                parent: false,
            },
        )
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let abort = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    let mode = delivery.as_str();
    let mut children = 0;

    // Release latency, one pair at a time.
    let mut latencies = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        let tx = c.transaction().await.unwrap();
        let parent = enqueue(&tx, &NewJob::new("p", serde_json::json!({})))
            .await
            .unwrap();
        let child = enqueue(
            &tx,
            &NewJob::new("c", serde_json::json!({})).after([parent]),
        )
        .await
        .unwrap();
        tx.commit().await.unwrap();
        children += 1;
        times.children(children, &c).await;
        latencies.push(ms(times.start_of(child) - times.end_of(parent)));
    }
    println!(
        "{mode}: release latency (parent's end → child's start): {}",
        quantiles(latencies)
    );

    // Fan-out, against as many jobs without a parent.
    let plain: Vec<NewJob> = (0..fanout)
        .map(|_| NewJob::new("c", serde_json::json!({})).delay(Duration::from_secs(3600)))
        .collect();
    let mut plain_ids = Vec::with_capacity(fanout);
    for chunk in plain.chunks(1000) {
        plain_ids.extend(enqueue_many(&c, chunk).await.unwrap());
    }
    let started = Instant::now();
    due_now(&c, &plain_ids).await;
    children += fanout;
    times.children(children, &c).await;
    let plain_rate = fanout as f64 / started.elapsed().as_secs_f64();

    let tx = c.transaction().await.unwrap();
    let parent = enqueue(
        &tx,
        &NewJob::new("p", serde_json::json!({})).delay(Duration::from_secs(3600)),
    )
    .await
    .unwrap();
    let enqueued = Instant::now();
    let mut ids = Vec::with_capacity(fanout);
    let kids: Vec<NewJob> = (0..fanout)
        .map(|_| NewJob::new("c", serde_json::json!({})).after([parent]))
        .collect();
    for chunk in kids.chunks(1000) {
        ids.extend(enqueue_many(&tx, chunk).await.unwrap());
    }
    let enqueue_took = enqueued.elapsed();
    tx.commit().await.unwrap();
    // The parent runs now: its end releases every child.
    due_now(&c, &[parent]).await;
    children += fanout;
    times.children(children, &c).await;
    let end = times.end_of(parent);
    let starts: Vec<Instant> = ids.iter().map(|id| times.start_of(*id)).collect();
    let first = *starts.iter().min().unwrap();
    let last = *starts.iter().max().unwrap();
    println!(
        "{mode}: fan-out 1 → {fanout}: children enqueued in {:.0} ms; parent's end → first child {:.1} ms, → last child {:.0} ms; children drained at {:.0} jobs/s, {:.0} jobs/s without a parent ({:.3}×)",
        ms(enqueue_took),
        ms(first - end),
        ms(last - end),
        fanout as f64 / (last - first).as_secs_f64().max(1e-6),
        plain_rate,
        (fanout as f64 / (last - end).as_secs_f64()) / plain_rate
    );

    // Fan-in: 1,000 parents over one child, then 10,000 as a tree.
    for leaves in [1000usize, 10_000] {
        let tx = c.transaction().await.unwrap();
        let list: Vec<NewJob> = (0..leaves)
            .map(|_| NewJob::new("p", serde_json::json!({})).delay(Duration::from_secs(3600)))
            .collect();
        let mut parents = Vec::with_capacity(leaves);
        for chunk in list.chunks(1000) {
            parents.extend(enqueue_many(&tx, chunk).await.unwrap());
        }
        let enqueued = Instant::now();
        let over: Vec<i64> = if leaves <= 1000 {
            parents.clone()
        } else {
            let mut mids = Vec::new();
            for group in parents.chunks(1000) {
                mids.push(
                    enqueue(
                        &tx,
                        &NewJob::new("p", serde_json::json!({})).after(group.to_vec()),
                    )
                    .await
                    .unwrap(),
                );
            }
            mids
        };
        let child = enqueue(
            &tx,
            &NewJob::new("c", serde_json::json!({})).after(over.clone()),
        )
        .await
        .unwrap();
        let enqueue_took = enqueued.elapsed();
        tx.commit().await.unwrap();
        due_now(&c, &parents).await;
        children += 1;
        times.children(children, &c).await;
        let last_leaf = parents.iter().map(|id| times.end_of(*id)).max().unwrap();
        let through = if leaves > 1000 {
            let last_mid = over.iter().map(|id| times.end_of(*id)).max().unwrap();
            format!(
                " (10 × 1,000, then 10 → 1; the last of the 10 ended {:.1} ms after the last leaf)",
                ms(last_mid - last_leaf)
            )
        } else {
            String::new()
        };
        println!(
            "{mode}: fan-in {leaves} → 1{through}: child enqueued in {:.0} ms; last leaf's end → child's start {:.1} ms",
            ms(enqueue_took),
            ms(times.start_of(child) - last_leaf)
        );
    }
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let pairs: usize = arg(&args, "--pairs", 300);
    let fanout: usize = arg(&args, "--fanout", 10_000);
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
        "machine: {} cores; {pairs} pairs, fan-out {fanout}, concurrency {concurrency}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let modes: String = arg(&args, "--mode", "tx,lease".to_string());
    for mode in modes.split(',') {
        match mode {
            "tx" => run(&url, Delivery::Tx, pairs, fanout, concurrency).await,
            "lease" => run(&url, Delivery::Lease, pairs, fanout, concurrency).await,
            other => panic!("--mode {other:?}: give tx, lease or tx,lease"),
        }
    }
    drop(cluster);
}
