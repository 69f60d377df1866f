//! `--rollup-cost`: what the per-minute rollup (`pgwake.minute_stats`,
//! counted in memory per run, flushed every 5 s) costs the worker's
//! throughput. Each run drains the same N jobs at batch B twice, once with
//! the rollup off and once on, in alternating order (off first in odd runs,
//! on first in even ones) so that a drift of the machine weighs on both
//! alike; the ratio of each run's pair is reported with its median. The
//! rollup's rows are checked to count every job drained with it on.

use std::time::Instant;

use serde::Serialize;

use super::database::Load;
use super::harness::{drain_timeout, Probe, RunningWorker, WORKER_APP};
use super::stats::{rate, ratio, Measure};
use super::Bench;
use pgwake::error::Result;

/// The rollup's cost in one delivery mode.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RollupCost {
    /// Delivery mode.
    pub mode: &'static str,
    /// Jobs per drain.
    pub jobs: u64,
    /// Jobs per claim.
    pub batch: usize,
    /// Worker throughput with the rollup off (jobs/s).
    pub off_jobs_per_s: Measure,
    /// Worker throughput with the rollup on (jobs/s).
    pub on_jobs_per_s: Measure,
    /// On / off of each run's pair.
    pub ratio: Measure,
}

/// Measure the rollup's cost in `bench`'s mode.
pub(crate) async fn run(bench: &Bench<'_>) -> Result<RollupCost> {
    let plan = bench.plan;
    let batch = plan.batch;
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for run in 1..=plan.runs {
        bench.progress(&format!(
            "rollup cost {run}/{}: {} jobs at batch {batch}, rollup off and on",
            plan.runs, plan.jobs
        ));
        let order = if run % 2 == 1 {
            [false, true]
        } else {
            [true, false]
        };
        for rollup in order {
            let r = drain(bench, batch, rollup).await?;
            if rollup {
                on.push(r);
            } else {
                off.push(r);
            }
        }
    }
    Ok(RollupCost {
        mode: bench.mode.as_str(),
        jobs: plan.jobs,
        batch,
        ratio: Measure::of(on.iter().zip(&off).map(|(a, b)| ratio(*a, *b)).collect()),
        off_jobs_per_s: Measure::of(off),
        on_jobs_per_s: Measure::of(on),
    })
}

async fn drain(bench: &Bench<'_>, batch: usize, rollup: bool) -> Result<f64> {
    let (db, jobs) = (bench.db, bench.plan.jobs);
    db.reset().await?;
    let spec = super::harness::WorkerSpec {
        rollup,
        ..bench.worker_spec(batch)
    };
    let worker = RunningWorker::start(&db.config, &spec, Probe::default()).await?;
    db.load(Load::ready(jobs)).await?;
    let t0 = Instant::now();
    let t1 = worker.wait_committed(jobs, drain_timeout(jobs)).await?;
    worker.stop().await?;
    db.wait_backends_gone(WORKER_APP).await?;
    if rollup {
        let counted = db.rollup_jobs().await?;
        if counted != jobs as i64 {
            return Err(super::aborted(format!(
                "the rollup counted {counted} of the {jobs} jobs drained"
            )));
        }
    }
    Ok(rate(jobs as f64, t1.duration_since(t0)))
}

/// The table of `--rollup-cost`.
pub(crate) fn render(costs: &[RollupCost]) -> String {
    let mut out = String::from(
        "Per-minute rollup cost: worker burn-down with the rollup off and on, same run\n",
    );
    out.push_str(&format!(
        "{:<6} {:>8} {:>6} {:>14} {:>14} {:>8}   {}\n",
        "MODE", "JOBS", "BATCH", "OFF (jobs/s)", "ON (jobs/s)", "ON/OFF", "ON/OFF PER RUN"
    ));
    for c in costs {
        out.push_str(&format!(
            "{:<6} {:>8} {:>6} {:>14.0} {:>14.0} {:>8.3}   {}\n",
            c.mode,
            c.jobs,
            c.batch,
            c.off_jobs_per_s.median,
            c.on_jobs_per_s.median,
            c.ratio.median,
            c.ratio
                .runs
                .iter()
                .map(|r| format!("{r:.3}"))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    out
}
