//! Shared by both delivery modes: turning claimed rows into jobs, the
//! checks before a job runs, deciding what an execution means for the job
//! (done, retry with backoff, dead, handed back), and reporting committed
//! outcomes (metrics, events, retry times for the poller).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_postgres::Row;

use crate::claimer::{JobEvent, Shared};
use crate::executor::Execution;
use crate::handler::Handler;
use crate::job::{Job, Outcome, Resolution};
use crate::metrics;

/// What is decided for a claimed job.
pub(crate) enum Verdict {
    Done,
    Retry {
        reason: String,
        delay: Duration,
    },
    Dead {
        reason: String,
    },
    Returned,
    /// lease mode: the lease expired and was rescued while the handler ran;
    /// the job belongs to someone else now, so nothing is written.
    LeaseLost,
}

pub(crate) struct Claimed {
    pub job: Job,
    pub raw_payload: String,
    pub last_error: Option<String>,
    pub verdict: Verdict,
    pub duration: Duration,
}

/// Most levels of nesting a payload may have to be decoded (serde_json's
/// recursion limit). A deeper payload is kept intact but cannot be handed to
/// a handler: its job goes to `dead_jobs` with a reason.
pub const PAYLOAD_DEPTH_LIMIT: usize = 128;

/// A claimed row: the job, its payload exactly as stored, why the payload
/// could not be decoded (if so), its previous error, and how long it waited.
pub(crate) struct ClaimedRow {
    pub job: Job,
    pub raw_payload: String,
    pub undecodable: Option<String>,
    pub last_error: Option<String>,
}

fn row_to_job(row: &Row) -> (ClaimedRow, f64) {
    let raw_payload: String = row.get(3);
    let (payload, undecodable) = match serde_json::from_str(&raw_payload) {
        Ok(v) => (v, None),
        Err(e) => (
            serde_json::Value::Null,
            Some(format!(
                "payload cannot be decoded ({e}); payloads nested deeper than {PAYLOAD_DEPTH_LIMIT} levels are not supported"
            )),
        ),
    };
    let job = Job {
        id: row.get(0),
        queue: row.get(1),
        task: row.get(2),
        payload,
        priority: row.get(4),
        run_at: row.get(5),
        // tx mode: completed attempts so far (the pending ledger is added by
        // the caller); lease mode: already counts this attempt.
        attempt: row.get(6),
        max_attempts: row.get(7),
        created_at: row.get(9),
    };
    (
        ClaimedRow {
            job,
            raw_payload,
            undecodable,
            last_error: row.get(8),
        },
        row.get(10),
    )
}

/// Jobs from claim rows (both modes return the same columns), in claim
/// order, with their pickup latency recorded.
pub(crate) fn claimed_jobs(rows: &[Row]) -> Vec<ClaimedRow> {
    let mut claimed: Vec<ClaimedRow> = Vec::with_capacity(rows.len());
    for row in rows {
        let (c, ready_for) = row_to_job(row);
        ::metrics::histogram!(metrics::PICKUP_LATENCY, "queue" => c.job.queue.clone())
            .record(ready_for.max(0.0));
        claimed.push(c);
    }
    // RETURNING order is not the claim order.
    claimed.sort_by(|a, b| {
        (a.job.priority, a.job.run_at, a.job.id).cmp(&(b.job.priority, b.job.run_at, b.job.id))
    });
    claimed
}

/// What must happen to `job` before any handler runs: `Ok(handler)` to run
/// it, or the verdict when it must not run (out of attempts because earlier
/// runs died, shutting down, no handler).
pub(crate) fn precheck(shared: &Shared, row: &ClaimedRow) -> Result<Arc<dyn Handler>, Verdict> {
    let job = &row.job;
    if let Some(reason) = &row.undecodable {
        return Err(Verdict::Dead {
            reason: reason.clone(),
        });
    }
    if job.attempt > job.max_attempts {
        return Err(Verdict::Dead {
            reason: format!(
                "attempt {} exceeds max_attempts {}: earlier runs never reported an outcome (the worker crashed or lost its connection while running this job)",
                job.attempt, job.max_attempts
            ),
        });
    }
    if shared.stop.is_cancelled() {
        return Err(Verdict::Returned);
    }
    match shared.registry.get(&job.task) {
        Some(h) => Ok(h.clone()),
        None => Err(Verdict::Dead {
            reason: format!(
                "no handler for task {:?}: register one (or a `*` catch-all) and retry it with `pgwake dead retry --id {}`",
                job.task, job.id
            ),
        }),
    }
}

/// What an execution means for the job.
pub(crate) fn decide(shared: &Shared, job: &Job, execution: Execution) -> Verdict {
    match execution {
        Execution::Finished(Outcome::Done) => Verdict::Done,
        Execution::Finished(Outcome::Retry { reason, after }) => {
            retry_or_bury(shared, job, reason, after)
        }
        Execution::Failed(reason) => retry_or_bury(shared, job, reason, None),
        Execution::Finished(Outcome::Fail { reason }) => Verdict::Dead { reason },
        Execution::Interrupted => Verdict::Returned,
    }
}

fn retry_or_bury(shared: &Shared, job: &Job, reason: String, after: Option<Duration>) -> Verdict {
    if job.attempt >= job.max_attempts {
        Verdict::Dead {
            reason: format!("{reason} (attempt {} of {})", job.attempt, job.max_attempts),
        }
    } else {
        Verdict::Retry {
            reason,
            delay: after.unwrap_or_else(|| shared.config.retry_delay(job.attempt)),
        }
    }
}

/// After the commit: metrics, events, and retry times for the poller.
pub(crate) fn report(shared: &Shared, results: &[Claimed], run_at: &[SystemTime]) {
    let now = SystemTime::now();
    for at in run_at.iter().filter(|at| **at > now) {
        shared.schedule.hint(*at);
    }
    for r in results {
        let (resolution, error) = match &r.verdict {
            Verdict::Done => (Resolution::Done, None),
            Verdict::Retry { reason, .. } => (Resolution::Retry, Some(reason.clone())),
            Verdict::Dead { reason } => (Resolution::Dead, Some(reason.clone())),
            Verdict::Returned => (Resolution::Returned, None),
            Verdict::LeaseLost => (Resolution::Returned, Some("lease lost".to_string())),
        };
        let outcome = resolution.as_str();
        let labels = [
            ("queue", r.job.queue.clone()),
            ("task", r.job.task.clone()),
            ("outcome", outcome.to_string()),
        ];
        ::metrics::counter!(metrics::JOBS, &labels).increment(1);
        ::metrics::histogram!(metrics::JOB_DURATION, &labels).record(r.duration.as_secs_f64());
        match resolution {
            Resolution::Dead => {
                tracing::warn!(job = r.job.id, task = %r.job.task, attempt = r.job.attempt, error = error.as_deref().unwrap_or(""), "job dead")
            }
            Resolution::Retry => {
                tracing::info!(job = r.job.id, task = %r.job.task, attempt = r.job.attempt, error = error.as_deref().unwrap_or(""), "job failed, will retry")
            }
            _ => tracing::debug!(job = r.job.id, task = %r.job.task, outcome, "job resolved"),
        }
        let _ = shared.events.send(JobEvent {
            id: r.job.id,
            queue: r.job.queue.clone(),
            task: r.job.task.clone(),
            attempt: r.job.attempt,
            resolution,
            error,
        });
    }
}
