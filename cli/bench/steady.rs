//! Phase 4, steady state in open loop. Jobs are offered at a fixed rate
//! (50% and 90% of the worker's batch-B burn-down rate) for `--duration`:
//! job i is due at `start + i / rate`. [`PRODUCERS`] producer connections
//! share the schedule round-robin; each inserts, in one autocommit
//! statement, every job of its share that is due and not yet sent, then
//! sleeps until its next one. Each job carries its intended time, and the
//! handler measures its start against that, so a producer (or database)
//! that falls behind adds to the latency instead of hiding it (no
//! coordinated omission).

use std::time::{Duration, Instant};

use futures::future::try_join_all;
use serde::Serialize;
use tokio_postgres::{Client, Statement};

use super::database::QUEUE;
use super::database::TASK;
use super::harness::{drain_timeout, unix_now, Probe, RunningWorker};
use super::stats::{rate, LatencyMs, Measure, Percentiles};
use super::Bench;
use pgwake::error::{Error, Result};

/// Producer connections offering the load.
pub(crate) const PRODUCERS: usize = 4;
/// Offered rates, as fractions of the burn-down rate.
const LEVELS: [f64; 2] = [0.5, 0.9];
const OFFER: &str = include_str!("sql/offer.sql");
const PRODUCER_APP: &str = "pgwake-bench-producer";

/// One offered rate.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SteadyLevel {
    /// Fraction of the burn-down rate offered.
    pub fraction: f64,
    /// Offered jobs per second.
    pub offered_jobs_per_s: f64,
    /// Jobs per run.
    pub jobs: u64,
    /// Rate at which the producers actually got the jobs in (they fall
    /// behind when inserts are slow; the latency then counts from the
    /// schedule anyway).
    pub inserted_jobs_per_s: Measure,
    /// Handler start minus the job's intended insert time, ms.
    pub latency_ms: LatencyMs,
}

/// Run phase 4 at every level.
pub(crate) async fn run(bench: &Bench<'_>, burn_down_rate: f64) -> Result<Vec<SteadyLevel>> {
    let mut levels = Vec::with_capacity(LEVELS.len());
    for fraction in LEVELS {
        let offered = burn_down_rate * fraction;
        let jobs = ((offered * bench.plan.duration.as_secs_f64()).round() as u64).max(1);
        let mut inserted = Vec::new();
        let mut latency = Vec::new();
        for run in 1..=bench.plan.runs {
            bench.progress(&format!(
                "steady state {run}/{}: {:.0}% of the burn-down rate, {offered:.0} jobs/s for {:?}",
                bench.plan.runs,
                fraction * 100.0,
                bench.plan.duration
            ));
            let (ins, lat) = one_run(bench, offered, jobs).await?;
            inserted.push(ins);
            latency.push(Percentiles::of(lat));
        }
        levels.push(SteadyLevel {
            fraction,
            offered_jobs_per_s: offered,
            jobs,
            inserted_jobs_per_s: Measure::of(inserted),
            latency_ms: LatencyMs::of(&latency),
        });
    }
    Ok(levels)
}

/// Offer `jobs` at `per_s`; returns the insert rate achieved and every
/// job's lateness in ms.
async fn one_run(bench: &Bench<'_>, per_s: f64, jobs: u64) -> Result<(f64, Vec<f64>)> {
    bench.db.reset().await?;
    let mut producers = Vec::with_capacity(PRODUCERS);
    for _ in 0..PRODUCERS {
        let client = bench.db.connect(PRODUCER_APP).await?;
        let stmt = client
            .prepare(OFFER)
            .await
            .map_err(Error::db("bench: prepare the offer"))?;
        producers.push((client, stmt));
    }
    let (probe, mut starts) = Probe::reporting();
    let worker = RunningWorker::start(
        &bench.db.config,
        &bench.worker_spec(bench.plan.batch),
        probe,
    )
    .await?;
    let collector = tokio::spawn(async move {
        let mut late_ms = Vec::new();
        while let Some(s) = starts.recv().await {
            late_ms.extend(s.late_s.map(|l| l * 1e3));
        }
        late_ms
    });
    let result = async {
        let schedule = Schedule {
            start: Instant::now() + Duration::from_millis(20),
            start_unix: unix_now() + 0.020,
            per_s,
            jobs,
            stride: PRODUCERS as u64,
        };
        let offered = try_join_all(
            producers
                .iter()
                .enumerate()
                .map(|(p, (client, stmt))| offer(client, stmt, &schedule, p as u64)),
        )
        .await?;
        let inserted = rate(
            jobs as f64,
            offered
                .into_iter()
                .max()
                .unwrap_or(schedule.start)
                .duration_since(schedule.start),
        );
        worker.wait_committed(jobs, drain_timeout(jobs)).await?;
        Ok::<_, pgwake::error::Error>(inserted)
    }
    .await;
    let stopped = worker.stop().await;
    let inserted = result?;
    stopped?;
    let late_ms = collector
        .await
        .map_err(|e| super::aborted(format!("the latency collector failed: {e}")))?;
    Ok((inserted, late_ms))
}

/// When each job is due.
struct Schedule {
    start: Instant,
    start_unix: f64,
    per_s: f64,
    jobs: u64,
    stride: u64,
}

impl Schedule {
    fn offset(&self, i: u64) -> Duration {
        Duration::from_secs_f64(i as f64 / self.per_s)
    }
}

/// Insert producer `first`'s share of the schedule (`first`, `first +
/// stride`, …) as it falls due; returns when its last insert returned.
async fn offer(client: &Client, stmt: &Statement, s: &Schedule, first: u64) -> Result<Instant> {
    let mut next = first;
    let mut done = Instant::now();
    while next < s.jobs {
        tokio::time::sleep_until((s.start + s.offset(next)).into()).await;
        let now = Instant::now();
        let mut due = Vec::new();
        while next < s.jobs && s.start + s.offset(next) <= now {
            due.push(s.start_unix + s.offset(next).as_secs_f64());
            next += s.stride;
        }
        if due.is_empty() {
            continue;
        }
        client
            .execute(stmt, &[&QUEUE, &TASK, &due])
            .await
            .map_err(Error::db("bench: offer jobs"))?;
        done = Instant::now();
    }
    Ok(done)
}
