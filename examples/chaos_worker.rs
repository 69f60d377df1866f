//! A worker process for fault tests and the soak (`examples/soak.rs`): a
//! real `pgwake::Worker` whose handler records every run in
//! `pgwake_runs(job_id, attempt, pid, overlap)` on its own connection — so
//! runs whose transaction later rolls back are recorded too — and holds a
//! session advisory lock on the job id while it runs: if another run of the
//! same job is alive, the lock is taken and the run records `overlap`. A
//! payload `{"lock": "K"}` locks K instead of the job id: runs of jobs
//! sharing K (an ordering key) must never overlap either.
//!
//! Tasks: `work` sleeps 0..=`--sleep-ms` ms; `block` blocks on its first
//! attempt (to be killed) and succeeds after; `poison` always blocks;
//! `crash` kills its own worker process (SIGKILL) once its run is recorded;
//! `flaky` fails one run in five; `fail_once` fails its first attempt;
//! `fail` always fails; `snooze` snoozes `{"times": N}` runs for `{"ms":
//! M}`, then (`{"block": true}`) blocks its first attempt, then succeeds;
//! `hog` blocks its thread for an hour; `relay` records its flow parents'
//! results in `pgwake_relay(job_id, parent_id, result)` and returns
//! `{"from": its id}`; `steps` runs three durable steps
//! (see [`steps`]); `progress` reports its progress on
//! its first attempt and blocks (to be killed), and runs as `gated` (with
//! no report) after; `gated`, once
//! its run is recorded, waits for the test's gate (the advisory lock
//! [`GATE`], which the test holds while it wants these runs kept alive)
//! and then sleeps `{"ms": N}` of its payload, or like `work` without it.
//!
//! ```text
//! cargo run --example chaos_worker -- --database-url URL [--lease] [--lease-handler] [--record-end] [--queues a,b] [--concurrency 16] [--prefetch N]
//! ```

use std::time::Duration;

use pgwake::{
    async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome, Worker, WorkerConfig,
};
use tokio_util::sync::CancellationToken;

/// The gate of `gated` runs: the two-key advisory lock (0, 1), a key space
/// apart from the one-key locks on job ids.
const GATE: (i32, i32) = (0, 1);

struct LockGuard(Option<deadpool_postgres::Object>);

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            drop(deadpool_postgres::Object::take(conn));
        }
    }
}

struct Chaos {
    ledger: deadpool_postgres::Pool,
    sleep_ms: u64,
    /// `--record-end`: also record when each run ended (`ended_at`, a
    /// column the test adds), for ledgers of running jobs over time.
    record_end: bool,
    /// `--record-admitted`: also record the run's rate admission
    /// (`admitted_at`, a column the test adds).
    record_admitted: bool,
    /// `--lease-handler`: the handler asks for lease mode (every queue then
    /// runs in lease mode through the all-queues claim).
    delivery: Delivery,
}

#[async_trait]
impl Handler for Chaos {
    fn delivery(&self) -> Delivery {
        self.delivery
    }

    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        // If this run is cancelled (its claim connection died, shutdown),
        // the guard closes the ledger connection so the server releases the
        // advisory lock at once instead of leaving it held on a pooled
        // connection (which would report false overlaps).
        let mut guard = LockGuard(Some(self.ledger.get().await?));
        let conn = guard.0.as_ref().expect("set above");
        let lock: i64 = match job.payload.get("lock").and_then(|k| k.as_str()) {
            Some(key) => conn
                .query_one("SELECT hashtextextended($1, 0)", &[&key])
                .await?
                .get(0),
            None => job.id,
        };
        let locked: bool = conn
            .query_one("SELECT pg_try_advisory_lock($1)", &[&lock])
            .await?
            .get(0);
        if self.record_admitted {
            conn.execute(
                "INSERT INTO pgwake_runs (job_id, attempt, pid, overlap, admitted_at)
                 VALUES ($1, $2, $3, $4, $5)",
                &[
                    &job.id,
                    &job.attempt,
                    &(std::process::id() as i32),
                    &!locked,
                    &ctx.admitted_at(),
                ],
            )
            .await?;
        } else {
            conn.execute(
                "INSERT INTO pgwake_runs (job_id, attempt, pid, overlap) VALUES ($1, $2, $3, $4)",
                &[
                    &job.id,
                    &job.attempt,
                    &(std::process::id() as i32),
                    &!locked,
                ],
            )
            .await?;
        }
        let result = match job.task.as_str() {
            "hog" => {
                // Ignores cancellation: blocks its thread.
                std::thread::sleep(Duration::from_secs(3600));
                Ok(Outcome::Done)
            }
            "crash" => {
                // The worker dies as in an OOM kill or a segfault in a
                // native library: no unwinding, nothing written after.
                // SAFETY: kill(2) on this process.
                unsafe {
                    libc::kill(libc::getpid(), libc::SIGKILL);
                }
                std::future::pending::<()>().await;
                Ok(Outcome::Done)
            }
            "poison" => {
                std::future::pending::<()>().await;
                Ok(Outcome::Done)
            }
            "block" if job.attempt == 1 => {
                std::future::pending::<()>().await;
                Ok(Outcome::Done)
            }
            "snooze" => {
                // Snoozes {"times": N} runs for {"ms": M}, then (with
                // {"block": true}) blocks its first attempt to be killed,
                // then succeeds. Runs are counted in the ledger: a handler
                // knows nothing of its earlier snoozes.
                let runs: i64 = conn
                    .query_one(
                        "SELECT count(*) FROM pgwake_runs WHERE job_id = $1",
                        &[&job.id],
                    )
                    .await?
                    .get(0);
                let times = job
                    .payload
                    .get("times")
                    .and_then(|v| v.as_i64())
                    .unwrap_or(1);
                let ms = job.payload.get("ms").and_then(|v| v.as_u64()).unwrap_or(10);
                let block = job.payload.get("block").and_then(|v| v.as_bool()) == Some(true);
                if runs <= times {
                    Ok(Outcome::snooze(Duration::from_millis(ms)))
                } else if block && job.attempt == 1 {
                    std::future::pending::<()>().await;
                    Ok(Outcome::Done)
                } else {
                    Ok(Outcome::Done)
                }
            }
            "flaky" if rand::random::<u8>().is_multiple_of(5) => Err("flaky failure".into()),
            "fail_once" if job.attempt == 1 => Err("first attempt fails".into()),
            "fail" => Err("always fails".into()),
            "progress" if job.attempt == 1 => {
                // Reports its run, then blocks to be killed.
                ctx.progress(
                    &serde_json::json!({"attempt": job.attempt, "pid": std::process::id()}),
                    Some("the first run"),
                )?;
                std::future::pending::<()>().await;
                Ok(Outcome::Done)
            }
            "steps" => steps(job, &ctx, conn).await,
            "relay" => {
                // A flow's job: records what its parents left it (in
                // `pgwake_relay`, a table the test creates), then passes
                // on its own id as its result.
                for (parent, got) in ctx.parent_results().await? {
                    let got = match got {
                        pgwake::ParentResult::Result(v) => v,
                        other => serde_json::json!(format!("{other:?}")),
                    };
                    conn.execute(
                        "INSERT INTO pgwake_relay (job_id, parent_id, result) VALUES ($1, $2, $3)",
                        &[&job.id, &parent, &got],
                    )
                    .await?;
                }
                let ms = rand::random::<u64>() % (self.sleep_ms + 1);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Outcome::done_with(serde_json::json!({"from": job.id})))
            }
            "gated" | "progress" => {
                // Blocks while the test holds the gate exclusively.
                conn.execute(
                    "SELECT pg_advisory_lock_shared($1, $2)",
                    &[&GATE.0, &GATE.1],
                )
                .await?;
                conn.execute(
                    "SELECT pg_advisory_unlock_shared($1, $2)",
                    &[&GATE.0, &GATE.1],
                )
                .await?;
                let ms = match job.payload.get("ms").and_then(|v| v.as_u64()) {
                    Some(ms) => ms,
                    None => rand::random::<u64>() % (self.sleep_ms + 1),
                };
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Outcome::Done)
            }
            _ => {
                let ms = rand::random::<u64>() % (self.sleep_ms + 1);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                Ok(Outcome::Done)
            }
        };
        if self.record_end {
            conn.execute(
                "UPDATE pgwake_runs SET ended_at = clock_timestamp()
                 WHERE job_id = $1 AND attempt = $2 AND pid = $3",
                &[&job.id, &job.attempt, &(std::process::id() as i32)],
            )
            .await?;
        }
        if locked {
            conn.execute("SELECT pg_advisory_unlock($1)", &[&lock])
                .await?;
        }
        // Unlocked: the connection may go back to the pool.
        guard.0.take();
        result
    }
}

/// The `steps` task: durable steps `s1`, `s2`, `s3`, each recording
/// `(job_id, step, run)` in `pgwake_step_ledger` — through the claim
/// transaction in tx mode (so a rolled-back step leaves no ledger row, as
/// it leaves no record), on the ledger's own connection in lease mode —
/// and returning its run's number (the job's count of runs in
/// `pgwake_runs`). Its payload says where the first two runs stop:
/// `{"fail_after": "s1"}` fails run 1 after that step; `{"block_in":
/// "s3"}` and `{"block_after": "s2"}` block run 2 inside or after a step,
/// to be killed, once they have said so in `pgwake_step_blocked`.
async fn steps(
    job: &Job,
    ctx: &JobContext<'_>,
    conn: &deadpool_postgres::Object,
) -> Result<Outcome, BoxError> {
    let run: i64 = conn
        .query_one(
            "SELECT count(*) FROM pgwake_runs WHERE job_id = $1",
            &[&job.id],
        )
        .await?
        .get(0);
    let at = |key: &str| {
        job.payload
            .get(key)
            .and_then(|v| v.as_str())
            .map(str::to_string)
    };
    let (fail_after, block_in, block_after) = (at("fail_after"), at("block_in"), at("block_after"));
    for name in ["s1", "s2", "s3"] {
        let ran: i64 = ctx
            .step(name, async {
                let ledger =
                    "INSERT INTO pgwake_step_ledger (job_id, step, run) VALUES ($1, $2, $3)";
                match ctx.transaction().await? {
                    Some(tx) => tx.execute(ledger, &[&job.id, &name, &run]).await?,
                    None => conn.execute(ledger, &[&job.id, &name, &run]).await?,
                };
                if run == 2 && block_in.as_deref() == Some(name) {
                    blocked(conn, job, name).await?;
                }
                Ok::<_, BoxError>(run)
            })
            .await?;
        debug_assert!(
            ran <= run,
            "a step's output comes from this run or an earlier one"
        );
        if run == 1 && fail_after.as_deref() == Some(name) {
            return Err(format!("run 1 fails after step {name}").into());
        }
        if run == 2 && block_after.as_deref() == Some(name) {
            blocked(conn, job, name).await?;
        }
    }
    Ok(Outcome::Done)
}

/// Say in `pgwake_step_blocked` (on the ledger's own connection: visible
/// at once) where this run blocks, then block, to be killed.
async fn blocked(conn: &deadpool_postgres::Object, job: &Job, at: &str) -> Result<(), BoxError> {
    conn.execute(
        "INSERT INTO pgwake_step_blocked (job_id, at) VALUES ($1, $2)",
        &[&job.id, &at],
    )
    .await?;
    std::future::pending::<()>().await;
    Ok(())
}

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Runtime::new()?;
    let result = runtime.block_on(run());
    // Like `pgwake run`: a handler that blocks its thread must not keep the
    // process alive after the worker returned.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let url: String = arg(&args, "--database-url", String::new());
    let db = pgwake::connect::parse_url(&url)?;
    let lease = args.iter().any(|a| a == "--lease");
    // `--queues a,b`: serve only these (each claimed by name); with
    // `--lease`, they run in lease mode (default: queue `default` only).
    let queues: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--queues")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').map(str::to_string).collect());
    let ledger = pgwake::connect::pool(
        &pgwake::connect::with_application_name(&db, "chaos-ledger"),
        64,
    )?;
    let config = WorkerConfig {
        concurrency: arg(&args, "--concurrency", 16),
        batch: arg(&args, "--batch", 10),
        prefetch: args
            .iter()
            .position(|a| a == "--prefetch")
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok()),
        prefetch_wait: Duration::from_millis(arg(
            &args,
            "--prefetch-wait-ms",
            pgwake::config::PREFETCH_WAIT_DEFAULT.as_millis() as u64,
        )),
        poll_interval: Duration::from_millis(arg(&args, "--poll-ms", 500)),
        listen: !args.iter().any(|a| a == "--no-listen"),
        queues: queues.clone(),
        lease_queues: match (lease, queues) {
            (true, Some(q)) => q,
            (true, None) => vec!["default".into()],
            (false, _) => vec![],
        },
        lease_duration: Duration::from_millis(arg(&args, "--lease-ms", 2000)),
        rescue_interval: Duration::from_millis(arg(&args, "--rescue-ms", 500)),
        retry_base: Duration::from_millis(50),
        retry_max: Duration::from_millis(500),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_secs(1),
        job_timeout: Duration::from_secs(30),
        sample_interval: None,
        grace_period: Duration::from_millis(arg(&args, "--grace-ms", 20_000)),
        ..WorkerConfig::default()
    };
    let worker = Worker::builder(db)
        .config(config)
        .handler(
            "*",
            Chaos {
                ledger,
                sleep_ms: arg(&args, "--sleep-ms", 5),
                record_end: args.iter().any(|a| a == "--record-end"),
                record_admitted: args.iter().any(|a| a == "--record-admitted"),
                delivery: if args.iter().any(|a| a == "--lease-handler") {
                    Delivery::Lease
                } else {
                    Delivery::Tx
                },
            },
        )
        .build()?;
    let stop = CancellationToken::new();
    let abort = CancellationToken::new();
    pgwake::signals::spawn(stop.clone(), abort.clone(), worker.config().grace_period)?;
    worker.run(stop, abort).await?;
    Ok(())
}
