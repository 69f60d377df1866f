//! Phase 0: what each kind of handler drains at batch B, against the raw
//! ceiling measured in the same run (the textbook `DELETE … SKIP LOCKED
//! RETURNING` in a loop on C connections), and `exec:true` against the
//! same command run by `xargs -P C` on the same machine.
//!
//! Each kind runs on a worker with its default delivery mode unless the
//! kind says otherwise: a Rust no-op (tx), a Rust no-op that asks for the
//! claim transaction (tx, a savepoint per job), a Rust no-op on a queue
//! forced into lease mode, a `sql` no-op function (tx, batched), and
//! `exec:true` (lease). The clock runs from the load's COMMIT to the last
//! committed outcome, as in the burn-down.
//!
//! Then the persistent handler (issue 34): the reference Python worker's
//! `noop` through the protocol (lease, one process per core taking C jobs
//! between them, `persistent::shape`), against the same no-op as one
//! `python3` per job (`exec`), and against the Rust no-op on a lease queue
//! of the same run. Without `python3` or the reference worker these rows
//! are left out, with a note saying why.

use std::process::Stdio;
use std::time::Instant;

use serde::Serialize;

use super::database::{Load, QUEUE};
use super::harness::{drain_timeout, HandlerKind, Probe, RunningWorker, WorkerSpec, WORKER_APP};
use super::mode::Mode;
use super::stats::{rate, ratio, Measure};
use super::Bench;
use pgwake::error::{Error, Result};

/// One handler kind's drain.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct KindRun {
    /// What ran.
    pub kind: &'static str,
    /// Jobs drained per run.
    pub jobs: u64,
    /// The worker's rate.
    pub jobs_per_s: Measure,
    /// Against what (`raw` or `xargs`).
    pub baseline: &'static str,
    /// The baseline's rate in the same runs.
    pub baseline_jobs_per_s: Measure,
    /// Worker / baseline, run by run.
    pub ratio: Measure,
}

/// The kinds, in report order: (name, handler, forced lease mode).
const KINDS: [(&str, HandlerKind, bool); 4] = [
    ("rust no-op (tx, default)", HandlerKind::Noop, false),
    ("rust no-op using the tx", HandlerKind::NoopInTx, false),
    ("rust no-op, lease queue", HandlerKind::Noop, true),
    ("sql no-op function", HandlerKind::Sql, false),
];

/// Most `exec:true` jobs per run: each one is a process.
const EXEC_JOBS: (u64, u64) = (3000, 200);

/// Most Python `exec` jobs per run: each starts an interpreter (about
/// 55 ms of CPU here), some 30 a second on two idle cores, a few while
/// other builds load them; the drain timeout is two minutes.
const EXEC_PYTHON_JOBS: (u64, u64) = (200, 10);

/// The persistent handler's rows.
pub(crate) const PERSISTENT_KIND: &str = "python3 persistent (noop)";

/// What phase 0 measured, and the notes on what it skipped.
pub(crate) type Kinds = (Vec<KindRun>, Vec<String>);

/// Run phase 0.
pub(crate) async fn run(bench: &Bench<'_>) -> Result<Kinds> {
    let plan = bench.plan;
    bench
        .db
        .connect(WORKER_APP)
        .await?
        .batch_execute(super::harness::SQL_NOOP)
        .await
        .map_err(Error::db("bench: create the sql no-op"))?;
    let jobs = plan.jobs;
    let exec_jobs = if plan.quick { EXEC_JOBS.1 } else { EXEC_JOBS.0 }.min(jobs);
    let mut raw = Vec::new();
    let mut by_kind = vec![Vec::new(); KINDS.len()];
    let (mut exec, mut xargs) = (Vec::new(), Vec::new());
    let python = super::persistent::commands();
    let python_exec_jobs = if plan.quick {
        EXEC_PYTHON_JOBS.1
    } else {
        EXEC_PYTHON_JOBS.0
    }
    .min(jobs);
    let (mut python_exec, mut persistent) = (Vec::new(), Vec::new());
    for run in 1..=plan.runs {
        bench.progress(&format!(
            "handler kinds {run}/{}: raw claim loop, {} kinds, exec:true vs xargs{}",
            plan.runs,
            KINDS.len(),
            if python.is_ok() {
                ", python3 persistent vs exec"
            } else {
                ""
            }
        ));
        raw.push(raw_run(bench, jobs).await?);
        for (i, (_, handler, lease)) in KINDS.iter().enumerate() {
            by_kind[i].push(worker_run(bench, *handler, *lease, jobs).await?);
        }
        exec.push(worker_run(bench, HandlerKind::ExecTrue, false, exec_jobs).await?);
        xargs.push(xargs_run(plan.concurrency, exec_jobs).await?);
        if python.is_ok() {
            python_exec
                .push(worker_run(bench, HandlerKind::ExecPython, false, python_exec_jobs).await?);
            persistent.push(worker_run(bench, HandlerKind::Persistent, false, jobs).await?);
        }
    }
    let lease = KINDS.iter().position(|k| k.2).expect("a lease kind");
    let lease_runs = by_kind[lease].clone();
    let mut out: Vec<KindRun> = KINDS
        .iter()
        .zip(by_kind)
        .map(|((kind, _, _), runs)| KindRun {
            kind,
            jobs,
            ratio: Measure::of(runs.iter().zip(&raw).map(|(w, r)| ratio(*w, *r)).collect()),
            jobs_per_s: Measure::of(runs),
            baseline: "raw",
            baseline_jobs_per_s: Measure::of(raw.clone()),
        })
        .collect();
    out.push(KindRun {
        kind: "exec:true (lease, default)",
        jobs: exec_jobs,
        ratio: Measure::of(
            exec.iter()
                .zip(&xargs)
                .map(|(w, x)| ratio(*w, *x))
                .collect(),
        ),
        jobs_per_s: Measure::of(exec),
        baseline: "xargs",
        baseline_jobs_per_s: Measure::of(xargs),
    });
    let notes = match python {
        Err(why) => vec![why],
        Ok(_) => {
            let versus = |baseline, runs: Vec<f64>| KindRun {
                kind: PERSISTENT_KIND,
                jobs,
                ratio: Measure::of(
                    persistent
                        .iter()
                        .zip(&runs)
                        .map(|(p, b)| ratio(*p, *b))
                        .collect(),
                ),
                jobs_per_s: Measure::of(persistent.clone()),
                baseline,
                baseline_jobs_per_s: Measure::of(runs),
            };
            out.push(versus("exec py", python_exec));
            out.push(versus("lease", lease_runs));
            let (processes, inflight) = super::persistent::shape(plan.concurrency);
            vec![format!(
                "{PERSISTENT_KIND}: lease mode, {processes} processes (one per core) of {inflight} jobs at once each; \"exec py\" runs {python_exec_jobs} jobs, one python3 each"
            )]
        }
    };
    Ok((out, notes))
}

async fn raw_run(bench: &Bench<'_>, jobs: u64) -> Result<f64> {
    bench.db.reset().await?;
    bench
        .db
        .load(Load {
            notify: false,
            ..Load::ready(jobs)
        })
        .await?;
    let tx_bench = Bench {
        mode: Mode::Tx,
        ..*bench
    };
    super::raw::drain(&tx_bench, bench.plan.batch, jobs).await
}

async fn worker_run(
    bench: &Bench<'_>,
    handler: HandlerKind,
    lease: bool,
    jobs: u64,
) -> Result<f64> {
    let db = bench.db;
    db.reset().await?;
    let spec = WorkerSpec {
        mode: if lease { Mode::Lease } else { Mode::Tx },
        concurrency: bench.plan.concurrency,
        prefetch: bench.plan.prefetch,
        batch: bench.plan.batch,
        queues: Some(vec![QUEUE.to_string()]),
        handler,
        rollup: true,
    };
    let worker = RunningWorker::start(&db.config, &spec, Probe::default()).await?;
    db.load(Load {
        task: handler.task(),
        ..Load::ready(jobs)
    })
    .await?;
    let t0 = Instant::now();
    let t1 = worker.wait_committed(jobs, drain_timeout(jobs)).await?;
    worker.stop().await?;
    db.wait_backends_gone(WORKER_APP).await?;
    Ok(rate(jobs as f64, t1.duration_since(t0)))
}

/// `seq N | xargs -P C -n 1 true`: the same processes with nothing around
/// them.
async fn xargs_run(concurrency: usize, jobs: u64) -> Result<f64> {
    let io = |e| Error::Io {
        context: "bench: xargs".into(),
        source: e,
    };
    let t0 = Instant::now();
    let status = tokio::process::Command::new("sh")
        .args([
            "-c",
            &format!("seq {jobs} | xargs -P {concurrency} -n 1 true"),
        ])
        .stdout(Stdio::null())
        .status()
        .await
        .map_err(io)?;
    if !status.success() {
        return Err(super::aborted(format!("xargs exited with {status}")));
    }
    Ok(rate(jobs as f64, t0.elapsed()))
}
