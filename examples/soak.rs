//! The chaos soak: several `chaos_worker` processes drain a steady stream of
//! jobs on a throwaway PostgreSQL while the soak kills workers with
//! `kill -9`, terminates their backends and restarts PostgreSQL (fast and
//! immediate). Then it drains, and prints the ledger: enqueued, completed,
//! lost (must be 0), run more than once (and why), overlaps, kills and
//! restarts. Exits non-zero if any job was lost or left behind.
//!
//! ```text
//! cargo build --release --examples
//! ./target/release/examples/soak --duration 180 --workers 3 --rate 400 --modes tx,lease
//! ```

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../cli/embedded.rs"]
#[allow(dead_code)]
mod embedded;

use embedded::{Cluster, ClusterOptions};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Fleet {
    bin: std::path::PathBuf,
    url: String,
    lease: bool,
    workers: Vec<Child>,
}

impl Fleet {
    fn spawn_one(&self) -> Child {
        let mut c = Command::new(&self.bin);
        c.args([
            "--database-url",
            &self.url,
            "--concurrency",
            "8",
            "--batch",
            "10",
            "--sleep-ms",
            "5",
            "--poll-ms",
            "500",
        ]);
        if self.lease {
            c.args(["--lease", "--lease-ms", "3000", "--rescue-ms", "500"]);
        }
        c.env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chaos_worker")
    }

    fn kill9_one(&mut self, i: usize) {
        let mut w = self.workers.swap_remove(i);
        let _ = w.kill();
        let _ = w.wait();
        let fresh = self.spawn_one();
        self.workers.push(fresh);
    }

    fn terminate_all(&mut self) {
        for w in &self.workers {
            // SAFETY: kill(2) on our own children.
            unsafe {
                libc::kill(w.id() as i32, libc::SIGTERM);
            }
        }
        for w in &mut self.workers {
            let _ = w.wait();
        }
    }
}

#[derive(Default, Debug)]
struct Chaos {
    kills: usize,
    terminations: usize,
    restarts_fast: usize,
    restarts_immediate: usize,
}

async fn connect(url: &str) -> tokio_postgres::Client {
    loop {
        match pgwake::connect::connect(&pgwake::connect::parse_url(url).unwrap()).await {
            Ok(c) => return c,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

async fn soak(mode: &str, duration: Duration, workers: usize, rate: u64) -> bool {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_with(ClusterOptions {
            durable: true,
            ..Default::default()
        })
    })
    .await
    .unwrap()
    .expect("start PostgreSQL");
    let url = cluster.url("postgres");
    {
        let mut c = connect(&url).await;
        pgwake::admin::schema::migrate(&mut c)
            .await
            .expect("migrate");
        c.batch_execute(
            "CREATE TABLE pgwake_runs (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
                                       overlap bool NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE soak_enqueued (id bigint PRIMARY KEY, task text NOT NULL);",
        )
        .await
        .unwrap();
    }
    let bin = std::env::current_exe()
        .unwrap()
        .with_file_name("chaos_worker");
    let mut fleet = Fleet {
        bin,
        url: url.clone(),
        lease: mode == "lease",
        workers: Vec::new(),
    };
    for _ in 0..workers {
        let w = fleet.spawn_one();
        fleet.workers.push(w);
    }
    // Producer: `rate` jobs/s in 10 batches a second, one in ten flaky.
    let producer_url = url.clone();
    let stop_at = Instant::now() + duration;
    let producer = tokio::spawn(async move {
        let mut enqueued = 0u64;
        let mut c = connect(&producer_url).await;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while Instant::now() < stop_at {
            tick.tick().await;
            let n = (rate / 10).max(1) as i32;
            let r = c
                .query_one(
                    "WITH j AS (INSERT INTO pgwake.jobs (task, max_attempts)
                                SELECT CASE WHEN g % 10 = 0 THEN 'flaky' ELSE 'work' END, 50
                                FROM generate_series(1, $1::int) g RETURNING id, task)
                     , l AS (INSERT INTO soak_enqueued SELECT id, task FROM j RETURNING 1)
                     SELECT count(*) FROM l",
                    &[&n],
                )
                .await;
            match r {
                Ok(row) => enqueued += row.get::<_, i64>(0) as u64,
                // The server is restarting: reconnect; nothing was inserted.
                Err(_) => c = connect(&producer_url).await,
            }
        }
        enqueued
    });
    // Chaos: every 2–4 s one action; a restart every ~20 s.
    let mut chaos = Chaos::default();
    let mut last_restart = Instant::now();
    let admin_url = url.clone();
    while Instant::now() < stop_at {
        tokio::time::sleep(Duration::from_millis(2000 + rand::random::<u64>() % 2000)).await;
        if Instant::now() >= stop_at {
            break;
        }
        if last_restart.elapsed() > Duration::from_secs(20) {
            let immediate = chaos.restarts_fast > chaos.restarts_immediate;
            let m = if immediate { "immediate" } else { "fast" };
            let c = &cluster;
            let ok = tokio::task::block_in_place(|| c.restart(m)).is_ok();
            if ok {
                if immediate {
                    chaos.restarts_immediate += 1;
                } else {
                    chaos.restarts_fast += 1;
                }
            }
            last_restart = Instant::now();
        } else if rand::random::<bool>() {
            let i = rand::random::<u32>() as usize % fleet.workers.len();
            fleet.kill9_one(i);
            chaos.kills += 1;
        } else {
            let c = connect(&admin_url).await;
            let _ = c
                .batch_execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'pgwake%'")
                .await;
            chaos.terminations += 1;
        }
    }
    let enqueued = producer.await.unwrap();
    // Drain: everything must leave the queue.
    let c = connect(&url).await;
    let drain_deadline = Instant::now() + Duration::from_secs(120);
    let mut left = i64::MAX;
    while Instant::now() < drain_deadline {
        left = c
            .query_one("SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(i64::MAX);
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    fleet.terminate_all();
    let runs = c
        .query("SELECT job_id, attempt, overlap FROM pgwake_runs", &[])
        .await
        .unwrap();
    let tasks: HashMap<i64, String> = c
        .query("SELECT id, task FROM soak_enqueued", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let dead: i64 = c
        .query_one("SELECT count(*) FROM pgwake.dead_jobs", &[])
        .await
        .unwrap()
        .get(0);
    let mut per_job: HashMap<i64, usize> = HashMap::new();
    let mut overlaps = 0;
    for r in &runs {
        *per_job.entry(r.get(0)).or_default() += 1;
        if r.get::<_, bool>(2) {
            overlaps += 1;
        }
    }
    let lost: Vec<i64> = tasks
        .keys()
        .filter(|id| !per_job.contains_key(id))
        .copied()
        .collect();
    let multi: Vec<(&i64, &usize)> = per_job.iter().filter(|(_, n)| **n > 1).collect();
    let multi_flaky = multi
        .iter()
        .filter(|(id, _)| tasks.get(id).map(|t| t == "flaky").unwrap_or(false))
        .count();
    println!(
        "== soak, {mode} mode: {}s, {workers} workers × 8, offered {rate} jobs/s",
        duration.as_secs()
    );
    println!("jobs enqueued:            {enqueued}");
    println!(
        "jobs completed:           {}",
        tasks.len() as i64 - left.max(0) - dead
    );
    println!("jobs dead:                {dead}");
    println!("jobs lost:                {}", lost.len());
    println!("left in the queue:        {left}");
    println!("run more than once:       {} ({} flaky jobs retried by design, {} after a kill -9, backend termination or restart)", multi.len(), multi_flaky, multi.len() - multi_flaky);
    println!("overlapping runs:         {overlaps} (a run started while the ledger lock of an earlier run was held)");
    println!("worker kills (kill -9):   {}", chaos.kills);
    println!("backend terminations:     {}", chaos.terminations);
    println!(
        "database restarts:        {} fast, {} immediate",
        chaos.restarts_fast, chaos.restarts_immediate
    );
    lost.is_empty() && left == 0 && enqueued as usize == tasks.len()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let duration = Duration::from_secs(arg(&args, "--duration", 180));
    let workers = arg(&args, "--workers", 3);
    let rate = arg(&args, "--rate", 400);
    let modes: String = arg(&args, "--modes", "tx,lease".to_string());
    let mut ok = true;
    for mode in modes.split(',') {
        ok &= soak(mode, duration, workers, rate).await;
    }
    if !ok {
        eprintln!("soak FAILED: jobs were lost or left behind");
        std::process::exit(1);
    }
}
