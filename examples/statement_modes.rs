//! What `--prepared-statements unnamed` costs the claim path, against the
//! default `cached`, on a direct connection: a worker with a no-op Rust
//! handler drains N jobs, in tx mode at batch 1 and at batch 100, and in
//! lease mode; the modes alternate, each figure is the median of the runs.
//!
//! ```sh
//! cargo run --release --example statement_modes            # throwaway durable cluster
//! cargo run --release --example statement_modes -- 5       # 5 runs per figure (default 3)
//! ```
//!
//! With `DATABASE_URL` set it uses that database instead (it must be
//! migrated and have no jobs; the example deletes nothing it did not add).

#[path = "../cli/embedded.rs"]
#[allow(dead_code)]
mod embedded;

use std::time::Instant;

use embedded::{Cluster, ClusterOptions};
use pgwake::config::PreparedStatements;
use pgwake::{async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome, Worker};

struct Noop(Delivery);

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        Ok(Outcome::Done)
    }

    fn delivery(&self) -> Delivery {
        self.0
    }
}

/// Jobs per second for one drain of `jobs` jobs.
async fn drain(
    url: &str,
    mode: PreparedStatements,
    delivery: Delivery,
    batch: usize,
    jobs: i64,
) -> f64 {
    let db = pgwake::connect::parse_url(url).unwrap();
    let producer = pgwake::connect::connect(&db).await.unwrap();
    let worker = Worker::builder(db)
        .config(pgwake::WorkerConfig {
            concurrency: 8,
            batch,
            sample_interval: None,
            scheduler: None,
            prepared_statements: mode,
            ..Default::default()
        })
        .handler("noop", Noop(delivery))
        .build()
        .unwrap();
    let mut events = worker.subscribe();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(worker.run(stop.clone(), stop.child_token()));
    // Every connection of the pool opened and its statements prepared
    // before the clock starts: one job per claim task first.
    producer
        .execute(
            "INSERT INTO pgwake.jobs (task) SELECT 'noop' FROM generate_series(1, 16)",
            &[],
        )
        .await
        .unwrap();
    for _ in 0..16 {
        events.recv().await.unwrap();
    }
    let started = Instant::now();
    producer
        .execute(
            "INSERT INTO pgwake.jobs (task) SELECT 'noop' FROM generate_series(1, $1::bigint)",
            &[&jobs],
        )
        .await
        .unwrap();
    let mut done = 0;
    while done < jobs {
        if events.recv().await.unwrap().outcome() == "done" {
            done += 1;
        }
    }
    let rate = jobs as f64 / started.elapsed().as_secs_f64();
    stop.cancel();
    run.await.unwrap().unwrap();
    for sql in [
        "VACUUM pgwake.jobs",
        "VACUUM pgwake.leased_jobs",
        "CHECKPOINT",
    ] {
        producer.batch_execute(sql).await.unwrap();
    }
    rate
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let runs: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().expect("runs: a number"))
        .unwrap_or(3);
    let (_cluster, url) = match std::env::var("DATABASE_URL") {
        Ok(url) => (None, url),
        Err(_) => {
            let cluster = Cluster::start_with(ClusterOptions {
                durable: true,
                ..Default::default()
            })
            .expect("start PostgreSQL");
            let url = cluster.url("postgres");
            let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&url).unwrap())
                .await
                .unwrap();
            pgwake::admin::schema::migrate(&mut c).await.unwrap();
            (Some(cluster), url)
        }
    };
    let cases = [
        ("tx, batch 1", Delivery::Tx, 1, 3_000),
        ("tx, batch 100", Delivery::Tx, 100, 50_000),
        ("lease, batch 100", Delivery::Lease, 100, 10_000),
    ];
    println!("| claim path | cached jobs/s | unnamed jobs/s | unnamed / cached |");
    println!("|---|---|---|---|");
    for (name, delivery, batch, jobs) in cases {
        let (mut cached, mut unnamed) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            cached.push(drain(&url, PreparedStatements::Cached, delivery, batch, jobs).await);
            unnamed.push(drain(&url, PreparedStatements::Unnamed, delivery, batch, jobs).await);
        }
        let (c, u) = (median(cached), median(unnamed));
        println!(
            "| {name} ({jobs} jobs) | {c:.0} | {u:.0} | {:.0}% |",
            100.0 * u / c
        );
    }
}
