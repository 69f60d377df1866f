//! The cost of a durable step (issue 37, "Done means"): JOBS jobs, each
//! running STEPS steps with a small output (`{"n": i}`), in one delivery
//! mode at a time, CONCURRENCY at once, on a throwaway PostgreSQL. Attempt
//! 1 of each job runs and records its steps, then fails; attempt 2 finds
//! them recorded and skips them. Prints, per mode, the latency of one
//! `ctx.step` call that records (p50, p99, mean) and of one that returns a
//! recorded output, and the steps recorded a second overall.
//!
//! ```text
//! cargo build --release --example steps_bench
//! ./target/release/examples/steps_bench [--jobs 500] [--steps 10] [--concurrency 8]
//! ```

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../cli/embedded.rs"]
#[allow(dead_code)]
mod embedded;

use pgwake::{async_trait, BoxError, Delivery, Job, JobContext, Outcome, Worker, WorkerConfig};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Microseconds of each step call: recording (attempt 1) and skipping
/// (attempt 2).
#[derive(Default)]
struct Timings {
    recording: Vec<f64>,
    skipping: Vec<f64>,
}

struct Stepper {
    delivery: Delivery,
    steps: usize,
    timings: Arc<Mutex<Timings>>,
}

#[async_trait]
impl pgwake::Handler for Stepper {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let mut took = Vec::with_capacity(self.steps);
        for i in 0..self.steps {
            let t = Instant::now();
            let _: serde_json::Value = ctx
                .step(&format!("step:{i}"), async {
                    Ok::<_, BoxError>(serde_json::json!({ "n": i }))
                })
                .await?;
            took.push(t.elapsed().as_secs_f64() * 1e6);
        }
        let mut timings = self.timings.lock().unwrap();
        if job.attempt == 1 {
            timings.recording.extend(took);
            drop(timings);
            Err("attempt 1 fails after its steps".into())
        } else {
            timings.skipping.extend(took);
            Ok(Outcome::Done)
        }
    }
}

fn summary(mut v: Vec<f64>) -> String {
    if v.is_empty() {
        return "none".into();
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| v[((v.len() - 1) as f64 * q) as usize];
    format!(
        "p50 {:.0} µs, p99 {:.0} µs, mean {:.0} µs ({} calls)",
        at(0.5),
        at(0.99),
        v.iter().sum::<f64>() / v.len() as f64,
        v.len()
    )
}

async fn run(url: &str, delivery: Delivery, jobs: usize, steps: usize, concurrency: usize) {
    let db = pgwake::connect::parse_url(url).unwrap();
    let c = pgwake::connect::connect(&db).await.unwrap();
    let list: Vec<pgwake::client::NewJob> = (0..jobs)
        .map(|_| pgwake::client::NewJob::new("steps", serde_json::json!({})))
        .collect();
    pgwake::client::enqueue_many(&c, &list).await.unwrap();
    let timings = Arc::new(Mutex::new(Timings::default()));
    let worker = Worker::builder(db.clone())
        .config(WorkerConfig {
            concurrency,
            retry_base: Duration::from_millis(1),
            retry_max: Duration::from_millis(1),
            sample_interval: None,
            ..WorkerConfig::default()
        })
        .handler(
            "steps",
            Stepper {
                delivery,
                steps,
                timings: timings.clone(),
            },
        )
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let abort = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    loop {
        let done = timings.lock().unwrap().skipping.len() >= jobs * steps;
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.cancel();
    task.await.unwrap().unwrap();
    let t = std::mem::take(&mut *timings.lock().unwrap());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{}: recording a step {}; returning a recorded one {}; {:.0} steps recorded/s overall; loadavg {}",
        delivery.as_str(),
        summary(t.recording),
        summary(t.skipping),
        (jobs * steps) as f64 / secs,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = arg(&args, "--jobs", 500);
    let steps: usize = arg(&args, "--steps", 10);
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
        "machine: {} cores; {jobs} jobs of {steps} steps, concurrency {concurrency}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    run(&url, Delivery::Tx, jobs, steps, concurrency).await;
    run(&url, Delivery::Lease, jobs, steps, concurrency).await;
    drop(cluster);
}
