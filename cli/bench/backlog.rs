//! Phase 6a, does the burn-down rate hold as the backlog grows? The worker
//! (C, batch B) idles; the backlog is inserted in one statement (one
//! NOTIFY); the clock runs from that COMMIT until as many outcomes are
//! committed as the small backlog holds ready jobs. Variants: small and
//! large backlog, all ready or every second job scheduled an hour ahead;
//! small and large are drained by the same count, so the small drain
//! empties its queue and the large one barely dents it.

use std::time::Instant;

use serde::Serialize;

use super::database::{Load, QUEUE};
use super::harness::{drain_timeout, Probe, RunningWorker};
use super::stats::{rate, ratio, Measure};
use super::Bench;
use pgwake::error::Result;

/// Burn-down rate by backlog.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Backlog {
    /// One entry per backlog size and schedule.
    pub variants: Vec<BacklogVariant>,
    /// Large / small with every job ready, paired per run.
    pub large_vs_small: Measure,
    /// Large / small with half scheduled in the future, paired per run.
    pub large_vs_small_half_future: Measure,
}

/// One backlog size and schedule.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BacklogVariant {
    /// Jobs waiting when the drain starts.
    pub waiting: u64,
    /// Every second one scheduled an hour ahead.
    pub half_future: bool,
    /// Jobs drained (timed).
    pub drained: u64,
    /// Burn-down rate.
    pub jobs_per_s: Measure,
}

/// Run phase 6a.
pub(crate) async fn run(bench: &Bench<'_>) -> Result<Backlog> {
    let plan = bench.plan;
    let variants = [
        (plan.backlog_small, false),
        (plan.backlog_large, false),
        (plan.backlog_small, true),
        (plan.backlog_large, true),
    ];
    let mut rates = vec![Vec::new(); variants.len()];
    for run in 1..=plan.runs {
        for (i, &(waiting, half_future)) in variants.iter().enumerate() {
            let drained = drained(plan.backlog_small, half_future);
            bench.progress(&format!(
                "backlog {run}/{}: {waiting} waiting{}, timing {drained}",
                plan.runs,
                if half_future {
                    " (half in the future)"
                } else {
                    ""
                }
            ));
            rates[i].push(one_run(bench, waiting, half_future, drained).await?);
        }
    }
    let paired = |small: usize, large: usize| {
        Measure::of(
            rates[large]
                .iter()
                .zip(&rates[small])
                .map(|(l, s)| ratio(*l, *s))
                .collect(),
        )
    };
    Ok(Backlog {
        large_vs_small: paired(0, 1),
        large_vs_small_half_future: paired(2, 3),
        variants: variants
            .iter()
            .zip(rates.iter())
            .map(|(&(waiting, half_future), r)| BacklogVariant {
                waiting,
                half_future,
                drained: drained(plan.backlog_small, half_future),
                jobs_per_s: Measure::of(r.clone()),
            })
            .collect(),
    })
}

/// Ready jobs in the small backlog: every one, or every odd one.
fn drained(small: u64, half_future: bool) -> u64 {
    if half_future {
        small.div_ceil(2)
    } else {
        small
    }
}

async fn one_run(bench: &Bench<'_>, waiting: u64, half_future: bool, drained: u64) -> Result<f64> {
    bench.db.reset().await?;
    let worker = RunningWorker::start(
        &bench.db.config,
        &bench.worker_spec(bench.plan.batch),
        Probe::default(),
    )
    .await?;
    let result = async {
        bench
            .db
            .load(Load {
                jobs: waiting,
                queue: QUEUE,
                half_future,
                ..Load::ready(waiting)
            })
            .await?;
        let t0 = Instant::now();
        let t1 = worker
            .wait_committed(drained, drain_timeout(drained))
            .await?;
        Ok::<_, pgwake::error::Error>(rate(drained as f64, t1.duration_since(t0)))
    }
    .await;
    let stopped = worker.stop().await;
    let r = result?;
    stopped?;
    Ok(r)
}
