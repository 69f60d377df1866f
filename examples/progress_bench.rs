//! The cost of progress (issue 37, "Done means"): JOBS lease-mode jobs run
//! at once for SECONDS, each reporting `ctx.progress` RATE times a second
//! (by default 1,000 jobs at 10/s: 10,000 reports a second), on a throwaway
//! PostgreSQL. The same run is made first with handlers that wake as often
//! but do not report, so the difference is what progress costs. Prints, for each run, the reports
//! made, the statements and rows written to `pgwake.job_progress` (counted
//! by statement triggers), and the CPU seconds of this process (the
//! worker) and of the database's backends, per second of the window.
//!
//! ```text
//! cargo build --release --examples
//! ./target/release/examples/progress_bench [--jobs 1000] [--rate 10] [--seconds 20] [--interval-ms 1000]
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
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

/// Runs until `until`, waking `rate` times a second, and reporting each
/// time if `report`.
struct Reporter {
    until: Instant,
    rate: u32,
    report: bool,
    reports: Arc<AtomicU64>,
}

#[async_trait]
impl pgwake::Handler for Reporter {
    fn delivery(&self) -> Delivery {
        Delivery::Lease
    }

    async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let every = Duration::from_secs_f64(1.0 / f64::from(self.rate.max(1)));
        let mut i = 0u64;
        while Instant::now() < self.until {
            if self.report {
                ctx.progress(
                    &serde_json::json!({"done": i, "of": 1_000_000}),
                    Some("importing rows"),
                )?;
                self.reports.fetch_add(1, Ordering::Relaxed);
            }
            i += 1;
            tokio::time::sleep(every).await;
        }
        Ok(Outcome::Done)
    }
}

/// utime + stime of process `pid`, in seconds.
fn cpu_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // After the command's ")" come state, ppid, …; utime and stime are
    // fields 14 and 15 of the whole line.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

async fn backend_pids(c: &tokio_postgres::Client) -> Vec<u32> {
    c.query(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get::<_, i32>(0) as u32)
    .collect()
}

async fn counters(c: &tokio_postgres::Client) -> (i64, i64) {
    let r = c
        .query_one("SELECT statements, rows FROM bench_progress", &[])
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// One run: `jobs` jobs for `seconds`, waking `rate`/s and reporting each
/// time if `report`; prints its figures.
async fn run(url: &str, jobs: usize, rate: u32, report: bool, seconds: u64, interval: Duration) {
    let db = pgwake::connect::parse_url(url).unwrap();
    let c = pgwake::connect::connect(&db).await.unwrap();
    c.batch_execute(
        "DELETE FROM pgwake.job_progress; UPDATE bench_progress SET statements = 0, rows = 0",
    )
    .await
    .unwrap();
    let jobs_list: Vec<pgwake::client::NewJob> = (0..jobs)
        .map(|_| pgwake::client::NewJob::new("report", serde_json::json!({})))
        .collect();
    pgwake::client::enqueue_many(&c, &jobs_list).await.unwrap();
    // A warm-up of 3 s (every job claimed and started), then the window.
    let warm = Duration::from_secs(3);
    let until = Instant::now() + warm + Duration::from_secs(seconds) + Duration::from_secs(1);
    let reports = Arc::new(AtomicU64::new(0));
    let worker = Worker::builder(db.clone())
        .config(WorkerConfig {
            concurrency: jobs,
            progress_interval: interval,
            sample_interval: None,
            ..WorkerConfig::default()
        })
        .handler(
            "report",
            Reporter {
                until,
                rate,
                report,
                reports: reports.clone(),
            },
        )
        .build()
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let abort = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(worker.run(stop.clone(), abort.clone()));
    tokio::time::sleep(warm).await;
    let running: i64 = c
        .query_one("SELECT count(*) FROM pgwake.leased_jobs", &[])
        .await
        .unwrap()
        .get(0);
    let pids = backend_pids(&c).await;
    let me = std::process::id();
    let (cpu0, db0) = (cpu_of(me), pids.iter().map(|p| cpu_of(*p)).sum::<f64>());
    let (s0, r0) = counters(&c).await;
    let n0 = reports.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let secs = t0.elapsed().as_secs_f64();
    let (cpu1, db1) = (cpu_of(me), pids.iter().map(|p| cpu_of(*p)).sum::<f64>());
    let (s1, r1) = counters(&c).await;
    let n1 = reports.load(Ordering::Relaxed);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{} {rate}/s per job, {running} jobs running: {:.0} reports/s, {:.2} statements/s, {:.0} rows/s; \
         worker CPU {:.3} s/s, database backends CPU {:.3} s/s; loadavg {}",
        if report { "reporting" } else { "waking (no report)" },
        (n1 - n0) as f64 / secs,
        (s1 - s0) as f64 / secs,
        (r1 - r0) as f64 / secs,
        (cpu1 - cpu0) / secs,
        (db1 - db0) / secs,
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    stop.cancel();
    task.await.unwrap().unwrap();
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let jobs: usize = arg(&args, "--jobs", 1000);
    let rate: u32 = arg(&args, "--rate", 10);
    let seconds: u64 = arg(&args, "--seconds", 20);
    let interval = Duration::from_millis(arg(&args, "--interval-ms", 1000));
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
        // Statements and rows written to job_progress: one INSERT statement
        // trigger per flush (an INSERT … ON CONFLICT fires it once), rows
        // from the INSERT's and the UPDATE's transition tables.
        c.batch_execute(
            "CREATE TABLE bench_progress (statements bigint NOT NULL, rows bigint NOT NULL);
             INSERT INTO bench_progress VALUES (0, 0);
             CREATE FUNCTION bench_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN UPDATE bench_progress SET statements = statements + 1, rows = rows + (SELECT count(*) FROM n);
                   RETURN NULL; END $$;
             CREATE FUNCTION bench_updated() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN UPDATE bench_progress SET rows = rows + (SELECT count(*) FROM n); RETURN NULL; END $$;
             CREATE TRIGGER bench_inserted AFTER INSERT ON pgwake.job_progress
                 REFERENCING NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION bench_inserted();
             CREATE TRIGGER bench_updated AFTER UPDATE ON pgwake.job_progress
                 REFERENCING NEW TABLE AS n FOR EACH STATEMENT EXECUTE FUNCTION bench_updated();",
        )
        .await
        .unwrap();
    }
    println!(
        "machine: {} cores; {jobs} lease-mode jobs for {seconds} s, --progress-interval {interval:?}",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    run(&url, jobs, rate, false, seconds, interval).await;
    run(&url, jobs, rate, true, seconds, interval).await;
    drop(cluster);
}
