//! Phase 6b, a long drain: does throughput hold to the end? `--backlog-large`
//! jobs are inserted (one NOTIFY) while the worker (C, batch B) idles;
//! committed outcomes are counted every half `--duration` (5 s by default)
//! until the backlog is gone or six `--duration`s have passed; once as is
//! and once with a transaction held open on another connection (`BEGIN;
//! SELECT txid_current();` from before the insert to the end), which keeps
//! vacuum from removing the drain's dead tuples. The last window, cut short
//! by the backlog running out, is left out. It runs once per mode: the
//! curve is the measurement.

use std::time::Duration;

use serde::Serialize;

use super::database::Load;
use super::harness::{Probe, RunningWorker};
use super::stats::{rate, ratio};
use super::Bench;
use pgwake::error::{Error, Result};

/// Longest drain, in `--duration`s.
const LENGTH: u32 = 6;
/// Windows per `--duration`.
const WINDOWS_PER_DURATION: u32 = 2;
/// Windows averaged at each end of the curve.
const END_WINDOWS: usize = 2;
const HOLDER_APP: &str = "pgwake-bench-holder";

/// One long drain.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LongDrain {
    /// Whether a transaction was held open during it.
    pub held_transaction: bool,
    /// Jobs waiting at the start.
    pub backlog: u64,
    /// Window length, seconds.
    pub window_s: f64,
    /// Jobs/s committed in each window.
    pub curve_jobs_per_s: Vec<f64>,
    /// Seconds averaged at each end.
    pub end_s: f64,
    /// Rate over the first `end_s`.
    pub first_jobs_per_s: f64,
    /// Rate over the last `end_s` of full windows.
    pub last_jobs_per_s: f64,
    /// Last / first.
    pub ratio: f64,
    /// Whether the whole backlog was drained (else the drain hit its time
    /// limit).
    pub drained: bool,
}

/// Run phase 6b, without and with a held transaction.
pub(crate) async fn run(bench: &Bench<'_>) -> Result<Vec<LongDrain>> {
    let length = bench.plan.duration * LENGTH;
    let window = bench.plan.duration / WINDOWS_PER_DURATION;
    let backlog = bench.plan.backlog_large;
    let mut drains = Vec::with_capacity(2);
    for held in [false, true] {
        bench.progress(&format!(
            "long drain{}: {backlog} jobs, at most {length:?}, {window:?} windows",
            if held {
                " with a transaction held open"
            } else {
                ""
            }
        ));
        drains.push(one_drain(bench, held, backlog, window, length).await?);
    }
    Ok(drains)
}

async fn one_drain(
    bench: &Bench<'_>,
    held: bool,
    backlog: u64,
    window: Duration,
    length: Duration,
) -> Result<LongDrain> {
    bench.db.reset().await?;
    let holder = match held {
        true => Some(hold_transaction(bench).await?),
        false => None,
    };
    let worker = RunningWorker::start(
        &bench.db.config,
        &bench.worker_spec(bench.plan.batch),
        Probe::default(),
    )
    .await?;
    let result = async {
        bench.db.load(Load::ready(backlog)).await?;
        sample(&worker, backlog, window, length).await
    }
    .await;
    let stopped = worker.stop().await;
    drop(holder);
    let (counts, drained) = result?;
    stopped?;
    Ok(curve(held, backlog, window, &counts, drained))
}

/// Committed counts at each window's end, and whether the backlog was
/// drained (the partial window at that point is dropped).
async fn sample(
    worker: &RunningWorker,
    backlog: u64,
    window: Duration,
    length: Duration,
) -> Result<(Vec<u64>, bool)> {
    let windows = (length.as_secs_f64() / window.as_secs_f64()).round() as usize;
    let start = tokio::time::Instant::now();
    let mut counts = Vec::with_capacity(windows + 1);
    counts.push(worker.committed());
    for w in 1..=windows {
        let end = start + window * w as u32;
        tokio::select! {
            _ = tokio::time::sleep_until(end) => counts.push(worker.committed()),
            r = worker.wait_committed(backlog, length) => {
                r?;
                return Ok((counts, true));
            }
        }
    }
    Ok((counts, false))
}

fn curve(held: bool, backlog: u64, window: Duration, counts: &[u64], drained: bool) -> LongDrain {
    let per_window: Vec<f64> = counts
        .windows(2)
        .map(|w| rate(w[1].saturating_sub(w[0]) as f64, window))
        .collect();
    let ends = END_WINDOWS.min(per_window.len() / 2).max(1);
    let avg = |xs: &[f64]| {
        if xs.is_empty() {
            0.0
        } else {
            xs.iter().sum::<f64>() / xs.len() as f64
        }
    };
    let first = avg(&per_window[..ends.min(per_window.len())]);
    let last = avg(&per_window[per_window.len().saturating_sub(ends)..]);
    LongDrain {
        held_transaction: held,
        backlog,
        window_s: window.as_secs_f64(),
        end_s: window.as_secs_f64() * ends as f64,
        first_jobs_per_s: first,
        last_jobs_per_s: last,
        ratio: ratio(last, first),
        curve_jobs_per_s: per_window,
        drained,
    }
}

/// A connection with a transaction that has an xid, pinning the vacuum
/// horizon until the client is dropped (the server then rolls it back).
async fn hold_transaction(bench: &Bench<'_>) -> Result<tokio_postgres::Client> {
    let client = bench.db.connect(HOLDER_APP).await?;
    client
        .batch_execute("BEGIN; SELECT txid_current();")
        .await
        .map_err(Error::db("bench: hold a transaction open"))?;
    Ok(client)
}
