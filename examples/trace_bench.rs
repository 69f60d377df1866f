//! What tracing costs (issue 39, "Done means"): JOBS no-op jobs, each with a
//! producer's trace context, drained by an in-process worker with tracing
//! off, then on with every span exported over OTLP/HTTP to a local sink
//! (a receiver that accepts and discards), alternated ROUNDS times on one
//! throwaway PostgreSQL, in one delivery mode. Prints each round's jobs/s,
//! the medians, and on/off.
//!
//! ```text
//! cargo build --release --example trace_bench
//! ./target/release/examples/trace_bench [--jobs 20000] [--rounds 3] [--mode tx|lease] [--concurrency 8]
//! ```

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

struct Noop(Delivery);

#[async_trait]
impl pgwake::Handler for Noop {
    fn delivery(&self) -> Delivery {
        self.0
    }

    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        Ok(Outcome::Done)
    }
}

/// An OTLP/HTTP endpoint that accepts every export (an empty protobuf
/// response is a valid ExportTraceServiceResponse).
async fn sink() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(|_body: axum::body::Bytes| async {
            (
                [(axum::http::header::CONTENT_TYPE, "application/x-protobuf")],
                Vec::<u8>::new(),
            )
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn drain(url: &str, mode: Delivery, jobs: usize, concurrency: usize, traced: bool) -> f64 {
    let db = pgwake::connect::parse_url(url).unwrap();
    let c = pgwake::connect::connect(&db).await.unwrap();
    for chunk in 0..jobs.div_ceil(1000) {
        let n = 1000.min(jobs - chunk * 1000);
        let list: Vec<pgwake::client::NewJob> = (0..n)
            .map(|i| {
                pgwake::client::NewJob::new("noop", serde_json::json!({ "i": i })).traceparent(
                    format!("00-{:032x}-{:016x}-01", chunk * 1000 + i + 1, i + 1),
                )
            })
            .collect();
        pgwake::client::enqueue_many(&c, &list).await.unwrap();
    }
    let worker = Worker::builder(db.clone())
        .config(WorkerConfig {
            concurrency,
            sample_interval: None,
            rollup: None,
            trace_jobs: traced,
            ..WorkerConfig::default()
        })
        .handler("noop", Noop(mode))
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let abort = tokio_util::sync::CancellationToken::new();
    let started = Instant::now();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    loop {
        let left: i64 = c
            .query_one(
                "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    stop.cancel();
    task.await.unwrap().unwrap();
    c.batch_execute("TRUNCATE pgwake.job_traces").await.unwrap();
    jobs as f64 / secs
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = arg(&args, "--jobs", 20_000);
    let rounds: usize = arg(&args, "--rounds", 3);
    let concurrency: usize = arg(&args, "--concurrency", 8);
    let mode = match arg(&args, "--mode", "tx".to_string()).as_str() {
        "lease" => Delivery::Lease,
        _ => Delivery::Tx,
    };
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
    // The binary's set-up: the exporter, and its layer for pgwake's spans.
    let exporter = pgwake::otel::install(&pgwake::otel::Settings {
        endpoint: Some(format!("http://{}", sink().await)),
        protocol: pgwake::otel::Protocol::HttpProtobuf,
    })
    .unwrap();
    tracing_subscriber::registry()
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(exporter.tracer())
                .with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target("pgwake", tracing::Level::INFO),
                ),
        )
        .init();
    println!(
        "machine: {} cores; {jobs} jobs a round, {rounds} rounds, {} mode, concurrency {concurrency}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mode.as_str()
    );
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        let a = drain(&url, mode, jobs, concurrency, false).await;
        let b = drain(&url, mode, jobs, concurrency, true).await;
        exporter.flush().await;
        println!("round {round}: off {a:.0} jobs/s, on (exported) {b:.0} jobs/s");
        off.push(a);
        on.push(b);
    }
    let (off, on) = (median(off), median(on));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "median: off {off:.0} jobs/s, on {on:.0} jobs/s, on/off {:.3}; loadavg {}",
        on / off,
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    drop(cluster);
}
