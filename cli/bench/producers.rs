//! Phase 5, what the NOTIFY trigger costs producers. Single-row autocommit
//! INSERTs in a tight loop on 1, 8 and 16 connections, each count for a
//! quarter of `--duration` with the trigger enabled, then disabled (`ALTER
//! TABLE pgwake.jobs DISABLE TRIGGER jobs_notify`). The worker (C, batch B)
//! works the producers' queue, as in production:
//! - idle: nothing waits when a count starts; the worker listens (and is
//!   registered as waiting, so the trigger NOTIFYs) and picks the
//!   producers' jobs up as they come;
//! - busy: before each count the queue is topped up to 1.5x what the worker
//!   drains in that time, so it drains a backlog all along.

use std::time::{Duration, Instant};

use futures::future::try_join_all;
use serde::Serialize;
use tokio_postgres::{Client, Statement};

use super::database::TASK;
use super::database::{Load, INSERT_ONE, QUEUE};
use super::harness::{Probe, RunningWorker};
use super::stats::{rate, ratio, Measure};
use super::Bench;
use pgwake::error::{Error, Result};

const PRODUCER_APP: &str = "pgwake-bench-producer";

/// Producer inserts/s, with and without the trigger.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Producers {
    /// Seconds per count.
    pub count_s: f64,
    /// One entry per worker state and producer count.
    pub cells: Vec<ProducerCell>,
    /// Whether a busy worker ever ran out of backlog during a count (its
    /// figures would then be closer to idle ones).
    pub backlog_ran_out: bool,
}

/// Inserts/s at one worker state and producer count.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProducerCell {
    /// `idle` or `busy`.
    pub workers: &'static str,
    /// Producer connections.
    pub producers: usize,
    /// Inserts/s with the trigger.
    pub with_trigger: Measure,
    /// Inserts/s without it.
    pub without_trigger: Measure,
    /// With / without, paired per run.
    pub ratio: Measure,
}

/// Per-run figures of one cell: (with, without).
type CellRuns = Vec<(f64, f64)>;

/// Run phase 5.
pub(crate) async fn run(bench: &Bench<'_>, burn_down_rate: f64) -> Result<Producers> {
    let count = bench.plan.duration / 4;
    let counts = &bench.plan.producers;
    let mut idle: Vec<CellRuns> = vec![Vec::new(); counts.len()];
    let mut busy: Vec<CellRuns> = vec![Vec::new(); counts.len()];
    let mut ran_out = false;
    for run in 1..=bench.plan.runs {
        for (state, acc) in [(false, &mut idle), (true, &mut busy)] {
            bench.progress(&format!(
                "producers {run}/{}: workers {}, {counts:?} producers, {count:?} per count",
                bench.plan.runs,
                state_name(state)
            ));
            let (pairs, out) = state_run(bench, state.then_some(burn_down_rate), count).await?;
            ran_out |= out;
            for (i, pair) in pairs.into_iter().enumerate() {
                acc[i].push(pair);
            }
        }
    }
    let cells = [(false, idle), (true, busy)]
        .into_iter()
        .flat_map(|(state, runs)| {
            counts
                .iter()
                .zip(runs)
                .map(move |(&producers, runs)| ProducerCell {
                    workers: state_name(state),
                    producers,
                    with_trigger: Measure::of(runs.iter().map(|r| r.0).collect()),
                    without_trigger: Measure::of(runs.iter().map(|r| r.1).collect()),
                    ratio: Measure::of(runs.iter().map(|r| ratio(r.0, r.1)).collect()),
                })
        })
        .collect();
    Ok(Producers {
        count_s: count.as_secs_f64(),
        cells,
        backlog_ran_out: ran_out,
    })
}

fn state_name(busy: bool) -> &'static str {
    if busy {
        "busy"
    } else {
        "idle"
    }
}

/// One worker state: every producer count, trigger on then off. `busy`
/// carries the worker's drain rate when it must be kept busy. Returns the
/// (with, without) pairs and whether the backlog ever ran out.
async fn state_run(
    bench: &Bench<'_>,
    busy: Option<f64>,
    count: Duration,
) -> Result<(CellRuns, bool)> {
    let db = bench.db;
    db.reset().await?;
    let most = bench.plan.producers.iter().copied().max().unwrap_or(1);
    let mut clients = Vec::with_capacity(most);
    for _ in 0..most {
        let client = db.connect(PRODUCER_APP).await?;
        let stmt = client
            .prepare(INSERT_ONE)
            .await
            .map_err(Error::db("bench: prepare the insert"))?;
        clients.push((client, stmt));
    }
    let worker = RunningWorker::start(
        &db.config,
        &bench.worker_spec(bench.plan.batch),
        Probe::default(),
    )
    .await?;
    let result = async {
        let mut pairs = Vec::with_capacity(bench.plan.producers.len());
        let mut ran_out = false;
        for &n in &bench.plan.producers {
            let mut pair = [0.0; 2];
            for (slot, trigger) in [(0, true), (1, false)] {
                if let Some(drain_rate) = busy {
                    top_up(bench, drain_rate, count).await?;
                }
                db.set_trigger(trigger).await?;
                pair[slot] = insert_for(&clients[..n], count).await?;
                ran_out |= busy.is_some() && db.ready(QUEUE).await? == 0;
            }
            pairs.push((pair[0], pair[1]));
        }
        db.set_trigger(true).await?;
        Ok::<_, pgwake::error::Error>((pairs, ran_out))
    }
    .await;
    let stopped = worker.stop().await;
    let out = result?;
    stopped?;
    Ok(out)
}

/// Make sure the busy worker has 1.5x what it drains in `count` waiting.
async fn top_up(bench: &Bench<'_>, drain_rate: f64, count: Duration) -> Result<()> {
    let need = (drain_rate * count.as_secs_f64() * 1.5).ceil() as i64;
    let have = bench.db.ready(QUEUE).await?;
    if have < need {
        bench.db.load(Load::ready((need - have) as u64)).await?;
    }
    Ok(())
}

/// Insert in a tight loop on every client for `count`; returns inserts/s.
async fn insert_for(clients: &[(Client, Statement)], count: Duration) -> Result<f64> {
    let start = Instant::now();
    let deadline = start + count;
    let inserted = try_join_all(clients.iter().map(|(client, stmt)| async move {
        let mut n = 0u64;
        while Instant::now() < deadline {
            client
                .query_one(stmt, &[&QUEUE, &TASK])
                .await
                .map_err(Error::db("bench: producer insert"))?;
            n += 1;
        }
        Ok::<u64, Error>(n)
    }))
    .await?;
    Ok(rate(inserted.iter().sum::<u64>() as f64, start.elapsed()))
}
