//! `pgwake bench`: how close the worker runs to the raw-SQL ceiling, how
//! fast it picks up a job, what the NOTIFY trigger costs producers, how
//! throughput holds as the backlog grows, and what each job costs.
//!
//! ```text
//!  database: throwaway durable cluster | fresh pgwake_bench_<random> on --database-url
//!   ├─ 0     handler kinds at batch B vs the raw ceiling (exec:true vs xargs,  handlers.rs
//!            a persistent Python no-op vs exec Python and the lease no-op)  persistent.rs
//!   └─ per delivery mode (Mode)
//!       1+2  raw claim loop vs Worker burn-down, batch 1 and B   burn.rs, raw.rs
//!       7    costs of those burn-downs (WAL, dead tuples, CPU)   burn.rs, resources.rs
//!       3    idle pickup latency, one job at a time              pickup.rs
//!       4    steady state, open loop at 50% / 90% of (2)         steady.rs
//!       5    producer inserts/s, trigger on/off, idle/busy       producers.rs
//!       6    backlog size and half scheduled; long drain         backlog.rs, drain.rs
//!   └─ targets (PASS/FAIL), table or JSON                        report.rs
//! ```
//!
//! Every measured run starts from an empty, vacuumed, checkpointed queue
//! ([`database::BenchDb::reset`]), and every number but the long drain's
//! curve is the median of `--runs` runs. The worker runs in this process
//! (library API, a no-op handler), so CPU and memory figures are the
//! worker's plus the bench harness's.

mod backlog;
mod burn;
mod database;
mod drain;
mod handlers;
mod harness;
mod mode;
mod persistent;
mod pickup;
mod producers;
mod raw;
mod report;
mod resources;
mod rollup;
mod stats;
mod steady;

use std::time::{Duration, Instant};

use database::BenchDb;
pub use mode::Mode;
use pgwake::error::{Error, Result};
use report::{ModeReport, Report};

/// `pgwake bench` flags. Sizes left unset take the full defaults, or the
/// `--quick` ones.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Benchmark on this server instead of a throwaway cluster: a fresh
    /// database `pgwake_bench_<random>` is created there and dropped at the end.
    #[arg(long)]
    pub database_url: Option<String>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Tiny sizes and one run (a smoke test; the figures mean little).
    #[arg(long)]
    pub quick: bool,
    /// Runs per measurement; the median is reported [default: 3, quick: 1].
    #[arg(long)]
    pub runs: Option<usize>,
    /// Worker claim tasks, and connections of the raw claim loop.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// The configured batch B (burn-downs also run at batch 1).
    #[arg(long, default_value_t = 100)]
    pub batch: usize,
    /// The worker's lease prefetch buffer (`pgwake run --prefetch`; 0: off)
    /// [default: the worker's].
    #[arg(long)]
    pub prefetch: Option<usize>,
    /// Jobs per burn-down at batch B; batch-1 burn-downs, some 20x slower,
    /// drain a fifth of it [default: 100000, quick: 2000].
    #[arg(long)]
    pub jobs: Option<u64>,
    /// The small backlog of the backlog-growth phase [default: 10000, quick: 1000].
    #[arg(long)]
    pub backlog_small: Option<u64>,
    /// The large backlog of the backlog-growth phase, and the long drain's
    /// [default: 1000000, quick: 50000].
    #[arg(long)]
    pub backlog_large: Option<u64>,
    /// Length of each steady-state rate level; producer counts run a quarter
    /// of it, the long drain at most six times it [default: 10s, quick: 1s].
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Delivery modes to measure, comma-separated. Lease mode claims one
    /// job per claim and takes longer than tx mode (about 10 minutes at
    /// the full sizes on two cores).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "tx")]
    pub mode: Vec<Mode>,
    /// Measure only the handler kinds (phase 0: Rust, `sql`, `exec` and
    /// persistent handlers against their baselines), not the delivery
    /// modes' phases.
    #[arg(long)]
    pub handlers_only: bool,
    /// Measure only the per-minute rollup's cost: the worker's burn-down at batch B with
    /// the rollup off and on, alternating, --runs pairs per mode.
    #[arg(long, conflicts_with = "handlers_only")]
    pub rollup_cost: bool,
}

fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 10s, 1m)"))
}

/// Producer connection counts of the producer-cost phase.
const PRODUCER_COUNTS: [usize; 3] = [1, 8, 16];
/// Idle pickups timed per run (full, quick).
const PICKUP_SAMPLES: (usize, usize) = (500, 20);

/// The sizes and settings one bench uses, resolved from [`BenchArgs`].
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Runs per measurement.
    pub runs: usize,
    /// Claim tasks / raw connections (C).
    pub concurrency: usize,
    /// The configured batch (B).
    pub batch: usize,
    /// The worker's lease prefetch buffer (`None`: the worker's default).
    pub prefetch: Option<usize>,
    /// Jobs per burn-down (N).
    pub jobs: u64,
    /// Small backlog.
    pub backlog_small: u64,
    /// Large backlog.
    pub backlog_large: u64,
    /// Steady-state level length (see [`BenchArgs::duration`]).
    pub duration: Duration,
    /// Idle pickups per run.
    pub pickup_samples: usize,
    /// Producer connection counts.
    pub producers: Vec<usize>,
    /// Modes to measure.
    pub modes: Vec<Mode>,
    /// Whether this is the `--quick` smoke run.
    pub quick: bool,
    /// Only phase 0 (`--handlers-only`).
    pub handlers_only: bool,
}

impl Plan {
    /// Resolve and check the flags; errors name the flag.
    pub fn from_args(args: &BenchArgs) -> Result<Plan> {
        let q = args.quick;
        let pick =
            |set: Option<u64>, full: u64, quick: u64| set.unwrap_or(if q { quick } else { full });
        let plan = Plan {
            runs: args.runs.unwrap_or(if q { 1 } else { 3 }),
            concurrency: args.concurrency,
            batch: args.batch,
            prefetch: args.prefetch,
            jobs: pick(args.jobs, 100_000, 2_000),
            backlog_small: pick(args.backlog_small, 10_000, 1_000),
            backlog_large: pick(args.backlog_large, 1_000_000, 50_000),
            duration: args
                .duration
                .unwrap_or(Duration::from_secs(if q { 1 } else { 10 })),
            pickup_samples: if q {
                PICKUP_SAMPLES.1
            } else {
                PICKUP_SAMPLES.0
            },
            producers: PRODUCER_COUNTS.to_vec(),
            modes: args.mode.clone(),
            quick: q,
            handlers_only: args.handlers_only,
        };
        plan.validate()?;
        Ok(plan)
    }

    fn validate(&self) -> Result<()> {
        let bad = |msg: &str| Err(Error::Config(msg.into()));
        if self.modes.is_empty() {
            return bad("--mode needs at least one mode");
        }
        if self.runs == 0 {
            return bad("--runs must be at least 1");
        }
        if self.concurrency == 0 || self.concurrency > pgwake::config::CONCURRENCY_MAX {
            return bad("--concurrency must be between 1 and 1000");
        }
        if self.batch == 0 || self.batch > pgwake::config::BATCH_MAX {
            return bad("--batch must be between 1 and 1000");
        }
        if self.jobs < 5 {
            return bad("--jobs must be at least 5");
        }
        if self.backlog_small < 2 || self.backlog_large < self.backlog_small {
            return bad(
                "--backlog-small must be at least 2 and --backlog-large at least --backlog-small",
            );
        }
        if self.duration < Duration::from_millis(200) {
            return bad("--duration must be at least 200ms");
        }
        Ok(())
    }

    /// Connections the bench opens at most at once (worker pools, listener,
    /// producers, control), checked against the server's `max_connections`.
    pub fn connections_needed(&self) -> usize {
        let worker = self.concurrency + 2 + 2 + 1;
        let producers = self
            .producers
            .iter()
            .copied()
            .max()
            .unwrap_or(1)
            .max(steady::PRODUCERS);
        worker + producers.max(self.concurrency) + 3
    }

    /// Jobs per burn-down at `batch`: N at batch B, N/5 at batch 1 (each of
    /// its jobs costs a commit, so a fifth gives as steady a figure).
    pub fn jobs_at(&self, batch: usize) -> u64 {
        if batch == 1 && self.batch > 1 {
            self.jobs / 5
        } else {
            self.jobs
        }
    }
}

/// What every phase needs: the database, the plan, the mode under test.
pub(crate) struct Bench<'a> {
    /// The bench's own database.
    pub db: &'a BenchDb,
    /// Sizes and settings.
    pub plan: &'a Plan,
    /// The delivery mode under test.
    pub mode: Mode,
    /// When the bench started (for progress lines).
    pub started: Instant,
}

impl Bench<'_> {
    /// The bench's worker: C claim tasks at `batch`, every queue.
    pub fn worker_spec(&self, batch: usize) -> harness::WorkerSpec {
        harness::WorkerSpec {
            mode: self.mode,
            concurrency: self.plan.concurrency,
            prefetch: self.plan.prefetch,
            batch,
            queues: None,
            handler: harness::HandlerKind::Noop,
            rollup: true,
        }
    }

    /// Progress on stderr (stdout carries the result).
    pub fn progress(&self, msg: &str) {
        let at = Duration::from_secs(self.started.elapsed().as_secs());
        eprintln!(
            "pgwake bench [{}] {}: {msg}",
            self.mode.as_str(),
            humantime::format_duration(at)
        );
    }
}

/// Run the benchmark and print the table (or, with `--json`, one JSON object).
pub async fn run(args: BenchArgs) -> Result<()> {
    let plan = Plan::from_args(&args)?;
    let started = Instant::now();
    if args.rollup_cost {
        return rollup_cost(&args, &plan, started).await;
    }
    eprintln!("pgwake bench: preparing the database …");
    let db = BenchDb::create(args.database_url.as_deref(), plan.connections_needed()).await?;
    let outcome = tokio::select! {
        r = run_all(&db, &plan, started) => r,
        e = interrupted() => Err(e),
    };
    let server = db.server.clone();
    let removed = db.remove().await;
    let ((kinds, notes), modes) = outcome?;
    removed?;
    let report = Report::new(&plan, server, (kinds, notes), modes, started.elapsed())?;
    if args.json {
        println!("{}", report.to_json()?);
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

/// `--rollup-cost`: the rollup's cost in each mode, and nothing else.
async fn rollup_cost(args: &BenchArgs, plan: &Plan, started: Instant) -> Result<()> {
    eprintln!("pgwake bench: preparing the database …");
    let db = BenchDb::create(args.database_url.as_deref(), plan.connections_needed()).await?;
    let measured = async {
        let mut costs = Vec::new();
        for &mode in &plan.modes {
            let bench = Bench {
                db: &db,
                plan,
                mode,
                started,
            };
            costs.push(rollup::run(&bench).await?);
        }
        Ok::<_, Error>(costs)
    };
    let outcome = tokio::select! {
        r = measured => r,
        e = interrupted() => Err(e),
    };
    let removed = db.remove().await;
    let costs = outcome?;
    removed?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "rollup_cost": costs }))
                .unwrap_or_default()
        );
    } else {
        print!("{}", rollup::render(&costs));
    }
    Ok(())
}

/// Phase 0 (handler kinds), then every mode's phases (unless
/// `--handlers-only`).
async fn run_all(
    db: &BenchDb,
    plan: &Plan,
    started: Instant,
) -> Result<(handlers::Kinds, Vec<ModeReport>)> {
    let kinds = handlers::run(&Bench {
        db,
        plan,
        mode: Mode::Tx,
        started,
    })
    .await?;
    if plan.handlers_only {
        return Ok((kinds, Vec::new()));
    }
    Ok((kinds, run_modes(db, plan, started).await?))
}

async fn run_modes(db: &BenchDb, plan: &Plan, started: Instant) -> Result<Vec<ModeReport>> {
    let mut reports = Vec::with_capacity(plan.modes.len());
    for &mode in &plan.modes {
        let bench = Bench {
            db,
            plan,
            mode,
            started,
        };
        reports.push(run_mode(&bench).await?);
    }
    Ok(reports)
}

async fn run_mode(bench: &Bench<'_>) -> Result<ModeReport> {
    let burn_down = burn::run(bench).await?;
    // The worker's own rate at batch B sets the steady-state offer and the
    // backlog that keeps it busy while producers are measured.
    let rate = burn_down
        .last()
        .map(|b| b.worker_jobs_per_s.median)
        .unwrap_or(0.0)
        .max(1.0);
    let idle_pickup = pickup::run(bench).await?;
    let steady_state = steady::run(bench, rate).await?;
    let producers = producers::run(bench, rate).await?;
    let backlog = backlog::run(bench).await?;
    let long_drain = drain::run(bench).await?;
    Ok(ModeReport {
        mode: bench.mode,
        burn_down,
        idle_pickup,
        steady_state,
        producers,
        backlog,
        long_drain,
    })
}

/// Resolves on Ctrl-C, so the database or cluster is still removed; never,
/// if the signal cannot be watched.
async fn interrupted() -> Error {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
    Error::Io {
        context: "bench: interrupted".into(),
        source: std::io::ErrorKind::Interrupted.into(),
    }
}

/// An error for a measurement that could not complete (a stalled drain, a
/// lost probe); the message says what was being measured.
pub(crate) fn aborted(what: String) -> Error {
    Error::Io {
        context: format!("bench: {what}"),
        source: std::io::Error::new(std::io::ErrorKind::TimedOut, "measurement aborted"),
    }
}
