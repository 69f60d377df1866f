//! Phases 1, 2 and 7: at batch 1 and batch B, each run drains the same
//! number of jobs (N at batch B, N/5 at batch 1) twice, first with the raw
//! claim loop ([`super::raw`]), then with a real worker, and records what
//! the worker's drain cost.
//!
//! Worker burn-down: the worker is started and left idle (listening); the N
//! jobs are inserted in one statement with the trigger on (one NOTIFY wakes
//! one claim task, full batches fan out to the others); the clock runs from
//! the insert's COMMIT returning to the N-th committed outcome. The raw
//! loop's jobs are loaded the same way but with `SET LOCAL pgwake.notify =
//! off` (nobody listens), and its clock runs from its first claim.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::database::{Load, TableCounters};
use super::harness::{drain_timeout, Probe, RunningWorker, WORKER_APP};
use super::resources::{process_cpu, MachineCpu};
use super::stats::{rate, ratio, Measure};
use super::Bench;
use pgwake::error::Result;

/// Raw ceiling and worker burn-down at one batch size.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BurnDown {
    /// Jobs per claim.
    pub batch: usize,
    /// Jobs drained per run.
    pub jobs: u64,
    /// The raw claim loop.
    pub raw_jobs_per_s: Measure,
    /// The worker.
    pub worker_jobs_per_s: Measure,
    /// Worker / raw of each run (the two drains of a run are paired).
    pub ratio: Measure,
    /// What the worker's drains cost.
    pub costs: Costs,
}

/// Costs of a worker drain, per job.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Costs {
    /// WAL written from the insert's commit to the last outcome's.
    pub wal_bytes_per_job: Measure,
    /// WAL of the bulk insert itself (for comparison).
    pub load_wal_bytes_per_job: Measure,
    /// Row versions the drain made dead (pg_stat_user_tables n_tup_upd +
    /// n_tup_del over the pgwake tables; cumulative, unlike n_dead_tup,
    /// which the drain's own autovacuums reset).
    pub dead_tuples_per_job: Measure,
    /// The same, per table.
    pub dead_tuples_per_job_by_table: BTreeMap<String, Measure>,
    /// n_dead_tup of the pgwake tables after the drain (what autovacuum had
    /// not yet removed), per job drained.
    pub dead_tuples_left_per_job: Measure,
    /// CPU of this process (worker in-process + bench harness; getrusage
    /// RUSAGE_SELF), seconds per 1,000 jobs.
    pub worker_cpu_s_per_1k_jobs: Measure,
    /// Busy CPU of the whole machine (PostgreSQL included), seconds per
    /// 1,000 jobs.
    pub machine_cpu_s_per_1k_jobs: Measure,
    /// Busy share of all cores during the drain, percent.
    pub machine_cpu_busy_pct: Measure,
}

/// One worker drain's costs, per job.
#[derive(Debug, Clone, Default)]
struct CostRun {
    wal: f64,
    load_wal: f64,
    dead_by_table: Vec<(String, f64)>,
    dead_left: f64,
    worker_cpu_1k: f64,
    machine_cpu_1k: f64,
    busy_pct: f64,
}

/// Run phases 1, 2 and 7.
pub(crate) async fn run(bench: &Bench<'_>) -> Result<Vec<BurnDown>> {
    let plan = bench.plan;
    let batches = bench.mode.batches(plan.batch);
    let mut raw = vec![Vec::new(); batches.len()];
    let mut worker = vec![Vec::new(); batches.len()];
    let mut costs: Vec<Vec<CostRun>> = vec![Vec::new(); batches.len()];
    for run in 1..=plan.runs {
        for (i, &batch) in batches.iter().enumerate() {
            bench.progress(&format!(
                "burn-down {run}/{}: batch {batch}, {} jobs, raw claim loop then worker",
                plan.runs,
                plan.jobs_at(batch)
            ));
            raw[i].push(raw_run(bench, batch).await?);
            let (rate, cost) = worker_run(bench, batch).await?;
            worker[i].push(rate);
            costs[i].push(cost);
        }
    }
    Ok(batches
        .iter()
        .enumerate()
        .map(|(i, &batch)| BurnDown {
            batch,
            jobs: plan.jobs_at(batch),
            ratio: Measure::of(
                worker[i]
                    .iter()
                    .zip(&raw[i])
                    .map(|(w, r)| ratio(*w, *r))
                    .collect(),
            ),
            raw_jobs_per_s: Measure::of(raw[i].clone()),
            worker_jobs_per_s: Measure::of(worker[i].clone()),
            costs: summarize(&costs[i]),
        })
        .collect())
}

async fn raw_run(bench: &Bench<'_>, batch: usize) -> Result<f64> {
    let jobs = bench.plan.jobs_at(batch);
    bench.db.reset().await?;
    bench
        .db
        .load(Load {
            notify: false,
            ..Load::ready(jobs)
        })
        .await?;
    super::raw::drain(bench, batch, jobs).await
}

async fn worker_run(bench: &Bench<'_>, batch: usize) -> Result<(f64, CostRun)> {
    let (db, jobs) = (bench.db, bench.plan.jobs_at(batch));
    db.reset().await?;
    let counters_before = db.table_counters().await?;
    let worker =
        RunningWorker::start(&db.config, &bench.worker_spec(batch), Probe::default()).await?;
    let wal_before_load = db.wal_bytes().await?;
    db.load(Load::ready(jobs)).await?;
    let t0 = Instant::now();
    let (cpu0, machine0) = (process_cpu()?, MachineCpu::now()?);
    let wal0 = db.wal_bytes().await?;
    let t1 = worker.wait_committed(jobs, drain_timeout(jobs)).await?;
    let (cpu1, machine1) = (process_cpu()?, MachineCpu::now()?);
    let wal1 = db.wal_bytes().await?;
    worker.stop().await?;
    db.wait_backends_gone(WORKER_APP).await?;
    let counters_after = db.table_counters().await?;

    let n = jobs as f64;
    let (machine_busy, busy_share) = machine1.since(&machine0);
    let cost = CostRun {
        wal: (wal1 - wal0) / n,
        load_wal: (wal0 - wal_before_load) / n,
        dead_by_table: dead_made(&counters_before, &counters_after, n),
        dead_left: counters_after.tables.iter().map(|t| t.2).sum::<f64>() / n,
        worker_cpu_1k: (cpu1.saturating_sub(cpu0)).as_secs_f64() * 1000.0 / n,
        machine_cpu_1k: machine_busy * 1000.0 / n,
        busy_pct: busy_share * 100.0,
    };
    Ok((rate(n, t1.duration_since(t0)), cost))
}

/// Row versions made dead between two readings, per job, by table.
fn dead_made(before: &TableCounters, after: &TableCounters, jobs: f64) -> Vec<(String, f64)> {
    after
        .tables
        .iter()
        .map(|(table, made, _)| {
            let earlier = before
                .tables
                .iter()
                .find(|t| &t.0 == table)
                .map_or(0.0, |t| t.1);
            (table.clone(), (made - earlier) / jobs)
        })
        .collect()
}

fn summarize(runs: &[CostRun]) -> Costs {
    let m = |f: fn(&CostRun) -> f64| Measure::of(runs.iter().map(f).collect());
    let mut by_table: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for run in runs {
        for (table, v) in &run.dead_by_table {
            by_table.entry(table.clone()).or_default().push(*v);
        }
    }
    Costs {
        wal_bytes_per_job: m(|c| c.wal),
        load_wal_bytes_per_job: m(|c| c.load_wal),
        dead_tuples_per_job: m(|c| c.dead_by_table.iter().map(|t| t.1).sum()),
        dead_tuples_per_job_by_table: by_table
            .into_iter()
            .map(|(t, v)| (t, Measure::of(v)))
            .collect(),
        dead_tuples_left_per_job: m(|c| c.dead_left),
        worker_cpu_s_per_1k_jobs: m(|c| c.worker_cpu_1k),
        machine_cpu_s_per_1k_jobs: m(|c| c.machine_cpu_1k),
        machine_cpu_busy_pct: m(|c| c.busy_pct),
    }
}
