//! What a wait for a signal costs (issue 37, "Done means"), on a throwaway
//! PostgreSQL with an in-process worker (Rust handlers, concurrency 8), in
//! each delivery mode:
//!
//! - **signal → resume latency**: JOBS jobs, one at a time on an idle
//!   worker: each job waits for its own key (its run ends with
//!   `Outcome::wait_for`, the wait committed: the worker's `waiting_for_signal`
//!   event); then `SELECT pgwake.signal(key, payload)` is sent from another
//!   connection, and the time is taken from just before that statement to
//!   the handler's next start, which reads the payload — the signal's
//!   commit and NOTIFY, the wake-up, the claim — once the worker is idle
//!   (registered in `pgwake.waiting_workers`, as it is when a signal comes
//!   minutes after the wait). p50 and p99.
//! - **many at once**: WIDE jobs wait, each for its own key; one
//!   transaction signals them all; the time to the last resume and the
//!   resume rate.
//!
//! ```text
//! cargo build --release --example signals_bench
//! ./target/release/examples/signals_bench [--jobs 300] [--wide 5000] [--mode tx,lease]
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../cli/embedded.rs"]
#[allow(dead_code)]
mod embedded;

use pgwake::client::{enqueue_many, NewJob};
use pgwake::{
    async_trait, BoxError, Delivery, Job, JobContext, JobEvent, Outcome, Signal, Worker,
    WorkerConfig,
};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Waits for `w:{id}` on its first run; on the next, records when it
/// started (and that the payload came).
struct Waiter {
    delivery: Delivery,
    resumed: Arc<Mutex<HashMap<i64, Instant>>>,
}

#[async_trait]
impl pgwake::Handler for Waiter {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let started = Instant::now();
        match ctx.signal().await? {
            None => Ok(Outcome::wait_for(
                format!("w:{}", job.id),
                Duration::from_secs(3600),
            )),
            Some(Signal::Received(_)) => {
                self.resumed.lock().unwrap().insert(job.id, started);
                Ok(Outcome::Done)
            }
            Some(other) => Err(format!("resumed without the signal: {other:?}").into()),
        }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn quantiles(mut v: Vec<f64>) -> String {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} jobs)",
        at(0.5),
        at(0.99),
        at(1.0),
        v.len()
    )
}

/// Wait for `n` events with this outcome.
async fn outcomes(events: &mut tokio::sync::broadcast::Receiver<JobEvent>, n: usize, what: &str) {
    let mut seen = 0;
    while seen < n {
        let e = tokio::time::timeout(Duration::from_secs(120), events.recv())
            .await
            .unwrap_or_else(|_| panic!("no {what} event in 2 minutes ({seen} of {n})"))
            .expect("events");
        if e.outcome() == what {
            seen += 1;
        } else if e.outcome() != "waiting_for_signal" && e.outcome() != "done" {
            panic!("unexpected outcome {}", e.outcome());
        }
    }
}

async fn run(url: &str, delivery: Delivery, jobs: usize, wide: usize) {
    let db = pgwake::connect::parse_url(url).unwrap();
    let c = pgwake::connect::connect(&db).await.unwrap();
    let sender = pgwake::connect::connect(&db).await.unwrap();
    let resumed = Arc::new(Mutex::new(HashMap::new()));
    let worker = Worker::builder(db.clone())
        .config(WorkerConfig {
            concurrency: 8,
            sample_interval: None,
            rollup: None,
            ..WorkerConfig::default()
        })
        .handler(
            "w",
            Waiter {
                delivery,
                resumed: resumed.clone(),
            },
        )
        .build()
        .unwrap();
    let mut events = worker.subscribe();
    let stop = tokio_util::sync::CancellationToken::new();
    let abort = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    let mode = delivery.as_str();
    let signal = sender
        .prepare("SELECT pgwake.signal($1, '{\"paid\": true}')")
        .await
        .unwrap();

    // One at a time: wait committed, then the signal.
    let mut latencies = Vec::with_capacity(jobs);
    let mut statement = Vec::with_capacity(jobs);
    for _ in 0..jobs {
        let id = enqueue_many(&c, &[NewJob::new("w", serde_json::json!({}))])
            .await
            .unwrap()[0];
        outcomes(&mut events, 1, "waiting_for_signal").await;
        // An idle worker, as when a signal comes minutes later: it has
        // registered as waiting (pgwake.waiting_workers), so the signal's
        // NOTIFY reaches it.
        while c
            .query_one(
                "SELECT count(*) FROM pgwake.waiting_workers WHERE expires_at > now()",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
            == 0
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let sent = Instant::now();
        let woke: i32 = sender
            .query_one(&signal, &[&format!("w:{id}")])
            .await
            .unwrap()
            .get(0);
        assert_eq!(woke, 1, "the job waited");
        statement.push(ms(sent.elapsed()));
        outcomes(&mut events, 1, "done").await;
        latencies.push(ms(resumed.lock().unwrap()[&id] - sent));
    }
    println!(
        "{mode}: signal → resume, one at a time: {}",
        quantiles(latencies)
    );
    println!(
        "{mode}:   of which the signal statement: {}",
        quantiles(statement)
    );

    // Many at once: WIDE waits, one transaction of signals.
    let batch: Vec<NewJob> = (0..wide)
        .map(|_| NewJob::new("w", serde_json::json!({})))
        .collect();
    let mut ids = Vec::with_capacity(wide);
    for chunk in batch.chunks(1000) {
        ids.extend(enqueue_many(&c, chunk).await.unwrap());
    }
    outcomes(&mut events, wide, "waiting_for_signal").await;
    let keys: Vec<String> = ids.iter().map(|id| format!("w:{id}")).collect();
    let sent = Instant::now();
    let woke: i64 = sender
        .query_one(
            "SELECT sum(pgwake.signal(k, '{\"paid\": true}'))::int8 FROM unnest($1::text[]) AS k",
            &[&keys],
        )
        .await
        .unwrap()
        .get(0);
    let signalled = sent.elapsed();
    assert_eq!(woke as usize, wide);
    outcomes(&mut events, wide, "done").await;
    let last = ids
        .iter()
        .map(|id| resumed.lock().unwrap()[id])
        .max()
        .unwrap();
    let took = last - sent;
    println!(
        "{mode}: {wide} jobs signalled in one statement ({:.0} ms): last resumed after {:.0} ms, {:.0} resumes/s",
        ms(signalled),
        ms(took),
        wide as f64 / took.as_secs_f64()
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = arg(&args, "--jobs", 300);
    let wide: usize = arg(&args, "--wide", 5_000);
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
        "machine: {} cores; {jobs} jobs one at a time, {wide} at once, concurrency 8",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let modes: String = arg(&args, "--mode", "tx,lease".to_string());
    for mode in modes.split(',') {
        match mode {
            "tx" => run(&url, Delivery::Tx, jobs, wide).await,
            "lease" => run(&url, Delivery::Lease, jobs, wide).await,
            other => panic!("--mode {other:?}: give tx, lease or tx,lease"),
        }
    }
    drop(cluster);
}
