//! A drain measured from the worker's side: migrate the database at URL,
//! insert JOBS ready jobs in queue `lq`, drain them with a worker at its
//! defaults, and print jobs/s and the CPU this process (the worker) spent
//! a job (user + system, from `/proc/self/stat`, Linux only). The worker's
//! CPU a job moves less with the machine's load than its throughput does;
//! the book's Performance page compares two builds with it.
//!
//! ```text
//! cargo run --release --example drain_cpu -- postgres://localhost/empty_db 100000        # Rust no-op, lease queue
//! cargo run --release --example drain_cpu -- postgres://localhost/empty_db 100000 sql    # `sql` no-op, tx mode
//! ```
use std::time::Instant;

use pgwake::{async_trait, BoxError, CancellationToken, Handler, Job, JobContext, Outcome};
use tokio::sync::broadcast::error::RecvError;

/// The Rust no-op.
struct Noop;

#[async_trait]
impl Handler for Noop {
    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        Ok(Outcome::Done)
    }
}

/// This process's CPU time so far, in seconds.
fn cpu_s() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let f: Vec<&str> = s.rsplit(')').next().unwrap().split_whitespace().collect();
    (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) / 100.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .expect("usage: drain_cpu URL [JOBS] [sql]");
    let jobs: i64 = std::env::args()
        .nth(2)
        .map_or(100_000, |s| s.parse().unwrap());
    let sql = std::env::args().nth(3).as_deref() == Some("sql");
    let db = pgwake::connect::parse_url(&url)?;
    let mut admin = pgwake::connect::connect(&db).await?;
    pgwake::admin::schema::migrate(&mut admin).await?;
    admin
        .execute(
            "INSERT INTO pgwake.jobs (queue, task, payload) SELECT 'lq', 'noop', '{}' FROM generate_series(1, $1::int8)",
            &[&jobs],
        )
        .await?;
    admin.batch_execute("VACUUM ANALYZE pgwake.jobs").await?;
    admin
        .batch_execute("CREATE OR REPLACE FUNCTION pgwake_bench_noop(p jsonb) RETURNS void LANGUAGE sql AS $$ $$")
        .await?;
    // sql: the `sql` no-op in tx mode (the queue's default), else the Rust no-op on a lease queue.
    let config = pgwake::WorkerConfig {
        lease_queues: if sql { vec![] } else { vec!["lq".into()] },
        queues: Some(vec!["lq".into()]),
        sample_interval: None,
        ..pgwake::WorkerConfig::default()
    };
    let builder = pgwake::Worker::builder(db.clone()).config(config);
    let builder = if sql {
        builder.handler_arc(
            "noop",
            pgwake::handlers::parse_flag("noop=sql:pgwake_bench_noop")?.1,
        )
    } else {
        builder.handler("noop", Noop)
    };
    let worker = builder.build()?;
    let mut events = worker.subscribe();
    let stop = CancellationToken::new();
    let (cpu0, t0) = (cpu_s(), Instant::now());
    let run = tokio::spawn(worker.run(stop.clone(), CancellationToken::new()));
    let mut n = 0i64;
    while n < jobs {
        match events.recv().await {
            Ok(_) => n += 1,
            Err(RecvError::Lagged(m)) => n += m as i64,
            Err(RecvError::Closed) => break,
        }
    }
    let (cpu1, dt) = (cpu_s(), t0.elapsed().as_secs_f64());
    stop.cancel();
    let _ = run.await;
    println!(
        "jobs/s {:.0} worker_cpu_us_per_job {:.2}",
        jobs as f64 / dt,
        (cpu1 - cpu0) * 1e6 / jobs as f64
    );
    Ok(())
}
