//! `lease` delivery mode, for long jobs (DESIGN.md §2).
//!
//! ```text
//!  claim: WITH c AS (DELETE … SKIP LOCKED RETURNING *) INSERT INTO leased_jobs
//!         (attempts + 1, worker_id, lease_until) … RETURNING   — autocommit
//!  run the handler outside any transaction; heartbeat every lease/3
//!     heartbeat finds no row → the lease was rescued: stop the handler
//!  complete, fenced by (id, attempt):
//!     done → DELETE   failed → back to jobs / dead   shutdown → back, attempt refunded
//!  a fenced write that matches no row is a late worker: it changes nothing
//! ```
//!
//! The attempt is committed with the claim, so a job that kills its worker
//! uses up attempts and ends dead (the rescuer buries a lease that expires
//! on the last attempt). No connection is held while the handler runs.

use std::time::{Duration, Instant, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::claimer::Shared;
use crate::completion::{claimed_jobs, decide, precheck, report, Claimed, Verdict};
use crate::connect::PooledConn;
use crate::error::{Error, Result};
use crate::executor::execute;
use crate::handler::JobContext;
use crate::job::Job;
use crate::metrics;
use crate::wake::Trigger;

const CLAIM: &str = include_str!("sql/lease_claim.sql");
const HEARTBEAT: &str = include_str!("sql/lease_heartbeat.sql");
const COMPLETE: &str = include_str!("sql/lease_complete.sql");
const REQUEUE: &str = include_str!("sql/lease_requeue.sql");
const BURY: &str = include_str!("sql/lease_bury.sql");

/// Claim one lease-mode job (a task has one free slot) and run it; returns
/// how many were claimed.
pub(crate) async fn claim_and_run(shared: &Shared, trigger: Trigger) -> Result<usize> {
    let rows = {
        let mut conn = PooledConn::get(&shared.pool, "lease claim: no connection").await?;
        let stmt = conn
            .prepare_cached(CLAIM)
            .await
            .map_err(Error::db("lease claim: prepare"))?;
        // One queue at a time (scalar `queue = $1`: an ordered index scan),
        // from a rotating start, until one has a job.
        let mut rows = Vec::new();
        for queue in crate::txmode::rotated(&shared.lease_queues, &shared.queue_cursor) {
            let r = conn
                .query(
                    &stmt,
                    &[
                        queue,
                        &1i64,
                        &shared.worker_id,
                        &shared.config.lease_duration.as_secs_f64(),
                    ],
                )
                .await;
            rows = conn.check(r).map_err(Error::db("lease claim"))?;
            if !rows.is_empty() {
                break;
            }
        }
        rows
        // The connection goes back to the pool here: nothing is held while
        // the handler runs.
    };
    let hit = if rows.is_empty() { "empty" } else { "hit" };
    ::metrics::counter!(metrics::CLAIMS, "trigger" => trigger.as_str(), "result" => hit)
        .increment(1);
    let mut results = Vec::with_capacity(rows.len());
    for row in claimed_jobs(&rows) {
        let (verdict, duration) = match precheck(shared, &row) {
            Ok(handler) => run_with_heartbeat(shared, &row.job, handler.as_ref()).await,
            Err(verdict) => (verdict, Duration::ZERO),
        };
        let mut claimed = Claimed {
            job: row.job,
            raw_payload: row.raw_payload,
            last_error: row.last_error,
            verdict,
            duration,
        };
        let run_at = match complete(shared, &claimed).await {
            Some(run_at) => run_at,
            // Fenced out: the job is someone else's now.
            None => {
                claimed.verdict = Verdict::LeaseLost;
                Vec::new()
            }
        };
        report(shared, std::slice::from_ref(&claimed), &run_at);
        results.push(claimed);
    }
    Ok(results.len())
}

/// Run the handler while a heartbeat keeps the lease. If the heartbeat finds
/// the lease gone (it expired and was rescued), the handler is stopped: the
/// job may already be running elsewhere.
async fn run_with_heartbeat(
    shared: &Shared,
    job: &Job,
    handler: &dyn crate::handler::Handler,
) -> (Verdict, Duration) {
    let stop_job = shared.abort.child_token();
    let lost = CancellationToken::new();
    let gauge = ::metrics::gauge!(metrics::JOBS_IN_FLIGHT, "queue" => job.queue.clone());
    gauge.increment(1.0);
    let ctx = JobContext {
        transaction: None,
        pool: &shared.pool,
        cancel: stop_job.child_token(),
    };
    let run = execute(
        handler,
        job,
        ctx,
        shared.config.lease_job_timeout,
        &stop_job,
    );
    let heartbeat = heartbeat(shared, job, &lost, &stop_job);
    let (execution, duration) = tokio::select! {
        r = run => r,
        () = heartbeat => unreachable!("the heartbeat only ends by cancelling the job"),
    };
    gauge.decrement(1.0);
    if lost.is_cancelled() {
        return (Verdict::LeaseLost, duration);
    }
    (decide(shared, job, execution), duration)
}

/// Renew the lease every third of its length until the job ends. Never
/// returns on its own: when the lease is gone it cancels `stop_job` (the
/// handler stops) and waits to be dropped.
async fn heartbeat(
    shared: &Shared,
    job: &Job,
    lost: &CancellationToken,
    stop_job: &CancellationToken,
) {
    let every = shared.config.lease_duration / 3;
    loop {
        tokio::time::sleep(every).await;
        match renew(shared, job).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(
                    job = job.id,
                    attempt = job.attempt,
                    "lease lost (expired and rescued): stopping this run"
                );
                lost.cancel();
                stop_job.cancel();
                std::future::pending::<()>().await;
            }
            // The database may be briefly away; the lease has two more
            // heartbeats of slack.
            Err(e) => tracing::warn!(job = job.id, error = %e, "lease heartbeat failed"),
        }
    }
}

async fn renew(shared: &Shared, job: &Job) -> Result<bool> {
    let mut conn = PooledConn::get(&shared.pool, "heartbeat: no connection").await?;
    let stmt = conn
        .prepare_cached(HEARTBEAT)
        .await
        .map_err(Error::db("heartbeat: prepare"))?;
    let r = conn
        .query(
            &stmt,
            &[
                &job.id,
                &job.attempt,
                &shared.config.lease_duration.as_secs_f64(),
            ],
        )
        .await;
    let rows = conn.check(r).map_err(Error::db("heartbeat"))?;
    Ok(!rows.is_empty())
}

/// Write the outcome, fenced by (id, attempt), retrying a failed write with
/// backoff for up to one lease length (after that the lease has expired and
/// the rescuer owns the job; at worst it runs again). Returns the new run_at
/// of a retried job, or `None` when the write was fenced out or abandoned.
async fn complete(shared: &Shared, c: &Claimed) -> Option<Vec<SystemTime>> {
    if matches!(c.verdict, Verdict::LeaseLost) {
        return None;
    }
    let give_up = Instant::now() + shared.config.lease_duration;
    let mut backoff = shared.config.reconnect_backoff();
    loop {
        match write_outcome(shared, c).await {
            Ok((0, _)) => {
                tracing::warn!(
                    job = c.job.id,
                    attempt = c.job.attempt,
                    "late completion fenced: the lease was rescued, the job will run again"
                );
                return None;
            }
            Ok((_, run_at)) => return Some(run_at),
            Err(e) if Instant::now() < give_up => {
                let delay = backoff.next().unwrap_or(shared.config.reconnect_max);
                tracing::warn!(job = c.job.id, error = %e, retry_in = ?delay, "writing a lease-mode outcome failed");
                tokio::time::sleep(delay).await;
            }
            Err(e) => {
                tracing::error!(job = c.job.id, error = %e, "giving up on writing the outcome; the lease will expire and the job run again");
                return None;
            }
        }
    }
}

/// One fenced write; returns rows matched and new run_at values.
async fn write_outcome(shared: &Shared, c: &Claimed) -> Result<(u64, Vec<SystemTime>)> {
    let mut conn = PooledConn::get(&shared.pool, "lease outcome: no connection").await?;
    let result = write_fenced(&conn, c).await;
    conn.check(result).map_err(Error::db("lease outcome"))
}

async fn write_fenced(
    conn: &deadpool_postgres::Object,
    c: &Claimed,
) -> std::result::Result<(u64, Vec<SystemTime>), tokio_postgres::Error> {
    let (id, attempt) = (c.job.id, c.job.attempt);
    let none: Option<f64> = None;
    let requeue = |attempts: i32, error: Option<String>, delay: Option<f64>| async move {
        let stmt = conn.prepare_cached(REQUEUE).await?;
        let rows = conn
            .query(&stmt, &[&id, &attempt, &attempts, &error, &delay])
            .await?;
        let at: Vec<SystemTime> = rows.iter().map(|r| r.get(0)).collect();
        Ok::<_, tokio_postgres::Error>((rows.len() as u64, at))
    };
    match &c.verdict {
        Verdict::Done => {
            let stmt = conn.prepare_cached(COMPLETE).await?;
            conn.execute(&stmt, &[&id, &attempt])
                .await
                .map(|n| (n, Vec::new()))
        }
        Verdict::Retry { reason, delay } => {
            requeue(attempt, Some(reason.clone()), Some(delay.as_secs_f64())).await
        }
        Verdict::Returned => requeue(attempt - 1, c.last_error.clone(), none).await,
        Verdict::Dead { reason } => {
            let stmt = conn.prepare_cached(BURY).await?;
            conn.query(&stmt, &[&id, &attempt, reason])
                .await
                .map(|rows| (rows.len() as u64, Vec::new()))
        }
        Verdict::LeaseLost => Ok((0, Vec::new())),
    }
}
