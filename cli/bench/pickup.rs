//! Phase 3, idle pickup latency. The worker (C tasks, batch B) idles,
//! listening. One job at a time is inserted by a single-row autocommit
//! INSERT on the bench's own connection; the next only after the previous
//! one's outcome is committed and the worker has had [`IDLE_GAP`] to fall
//! idle again.
//!
//! Timed, on this process's monotonic clock:
//! - `t_sent`: just before the INSERT is sent;
//! - `t_committed`: when the INSERT's reply (its COMMIT) has arrived;
//! - `t_start`: the first thing the handler does.
//!
//! The figure is `t_start - t_committed`: NOTIFY delivery to the listener,
//! the wake-up, the claim round trips, up to the handler. It can be
//! slightly negative if the worker wins the race with the producer's own
//! reply. `t_start - t_sent` (which adds the INSERT and its fsync) is
//! reported beside it.

use std::time::Duration;

use serde::Serialize;

use super::database::TASK;
use super::database::{INSERT_ONE, QUEUE};
use super::harness::{Probe, RunningWorker};
use super::stats::{signed_ms, LatencyMs, Percentiles};
use super::Bench;
use pgwake::error::{Error, Result};

/// Pause after a job's outcome commits before the next insert: long enough
/// for the claim task's follow-up (empty) claim to end and for the worker
/// to register as waiting (it lingers [`pgwake::internal::LINGER`] after its
/// last hit), so every pickup starts from an idle, listening worker. 20 ms
/// today.
const IDLE_GAP: Duration = pgwake::internal::LINGER.saturating_mul(4);
/// Longest wait for one pickup.
const PICKUP_TIMEOUT: Duration = Duration::from_secs(10);
const PRODUCER_APP: &str = "pgwake-bench-producer";

/// Idle pickup latency.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct IdlePickup {
    /// What is timed.
    pub definition: &'static str,
    /// Jobs timed per run.
    pub samples: usize,
    /// From the INSERT's commit returning to the handler's start, ms.
    pub from_commit_ms: LatencyMs,
    /// From just before the INSERT is sent to the handler's start, ms.
    pub from_send_ms: LatencyMs,
}

/// The definition printed with the figures.
pub(crate) const DEFINITION: &str = "handler start minus the moment the producer's autocommit INSERT returned (commit acknowledged); one job at a time, worker idle and listening";

/// Run phase 3.
pub(crate) async fn run(bench: &Bench<'_>) -> Result<IdlePickup> {
    let mut from_commit = Vec::new();
    let mut from_send = Vec::new();
    for run in 1..=bench.plan.runs {
        bench.progress(&format!(
            "idle pickup {run}/{}: {} single inserts",
            bench.plan.runs, bench.plan.pickup_samples
        ));
        let (commit, send) = one_run(bench).await?;
        from_commit.push(Percentiles::of(commit));
        from_send.push(Percentiles::of(send));
    }
    Ok(IdlePickup {
        definition: DEFINITION,
        samples: bench.plan.pickup_samples,
        from_commit_ms: LatencyMs::of(&from_commit),
        from_send_ms: LatencyMs::of(&from_send),
    })
}

async fn one_run(bench: &Bench<'_>) -> Result<(Vec<f64>, Vec<f64>)> {
    bench.db.reset().await?;
    let (probe, mut starts) = Probe::reporting();
    let worker = RunningWorker::start(
        &bench.db.config,
        &bench.worker_spec(bench.plan.batch),
        probe,
    )
    .await?;
    let result = async {
        let producer = bench.db.connect(PRODUCER_APP).await?;
        let insert = producer
            .prepare(INSERT_ONE)
            .await
            .map_err(Error::db("bench: prepare the insert"))?;
        let samples = bench.plan.pickup_samples;
        let (mut from_commit, mut from_send) =
            (Vec::with_capacity(samples), Vec::with_capacity(samples));
        for i in 1..=samples as u64 {
            tokio::time::sleep(IDLE_GAP).await;
            let sent = std::time::Instant::now();
            let id: i64 = producer
                .query_one(&insert, &[&QUEUE, &TASK])
                .await
                .map_err(Error::db("bench: insert one job"))?
                .get(0);
            let committed = std::time::Instant::now();
            let start = loop {
                match tokio::time::timeout(PICKUP_TIMEOUT, starts.recv()).await {
                    Ok(Some(s)) if s.id == id => break s,
                    Ok(Some(_)) => continue,
                    _ => {
                        return Err(super::aborted(format!(
                            "job {id} was not picked up within {PICKUP_TIMEOUT:?}"
                        )))
                    }
                }
            };
            from_commit.push(signed_ms(committed, start.at));
            from_send.push(signed_ms(sent, start.at));
            worker.wait_committed(i, PICKUP_TIMEOUT).await?;
        }
        Ok((from_commit, from_send))
    }
    .await;
    let stopped = worker.stop().await;
    let samples = result?;
    stopped?;
    Ok(samples)
}
