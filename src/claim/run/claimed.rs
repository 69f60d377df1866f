//! Claimed rows as jobs (read by [`row`](super::row)) and claim order.
//! Shared by both delivery modes.

use crate::job::Job;

/// A claimed job with what the claim path needs beside it.
#[derive(Clone)]
pub(crate) struct Claimed {
    pub job: Job,
    /// Why the payload cannot be decoded, if so.
    pub undecodable: Option<String>,
    /// Its `last_error` before this run (kept when it is handed back).
    pub last_error: Option<String>,
    /// lease mode: the claim token that fences every write.
    pub token: i64,
    /// Its ordering and unique keys: tx mode writes them back with it;
    /// lease mode (which keeps them in `leased_jobs`) wakes a claim when a
    /// keyed job ends.
    pub keys: Keys,
    /// When a rate-limited queue admitted this run (database clock; see
    /// rate.rs); `None` for other queues.
    pub admitted_at: Option<std::time::SystemTime>,
    /// lease mode: the claim took it ahead of the free slots, into the
    /// prefetch buffer (`leased_jobs.buffered`, migration 0024).
    pub buffered: bool,
    /// lease mode: its attempt was refunded before, buffered when its
    /// worker died (`jobs.suspect`): it may kill its workers.
    pub suspect: bool,
    /// Seconds it was ready before the claim (its pickup latency), for the
    /// per-minute rollup.
    pub ready_for: f64,
    /// Its trace context and spans, when the worker traces jobs
    /// (`crate::claim::run::trace::attach`).
    pub trace: Option<std::sync::Arc<JobTrace>>,
    /// lease mode: its recorded steps and parents' results, read with the
    /// claim for a handler that reads them up front (`exec`).
    pub inputs: Option<crate::steps::Inputs>,
}

/// Defined beside the handler's context, which reads it.
pub(crate) use crate::handler::Keys;

/// One claimed job's tracing: the producer's context (if it gave one), the
/// job's span, and the outcome span while its outcome is being written.
#[derive(Debug)]
pub(crate) struct JobTrace {
    /// The producer's context, as stored.
    pub producer: Option<crate::trace::TraceContext>,
    /// `pgwake.job`: from the claim to the committed outcome.
    pub span: tracing::Span,
    /// `pgwake.outcome`: from the end of the run to the committed outcome.
    pub outcome: std::sync::Mutex<Option<tracing::Span>>,
}

/// Claim order (RETURNING order is not the claim order).
pub(crate) fn sort_claim_order(claimed: &mut [Claimed]) {
    claimed.sort_by(|a, b| {
        (a.job.priority, a.job.run_at, a.job.id).cmp(&(b.job.priority, b.job.run_at, b.job.id))
    });
}

#[cfg(test)]
impl Claimed {
    /// A claimed job `id` of task `t` in queue `q`, first attempt of 25.
    pub(crate) fn for_tests(id: i64) -> Claimed {
        let now = std::time::SystemTime::now();
        Claimed {
            job: Job {
                id,
                queue: "q".into(),
                task: "t".into(),
                payload: serde_json::json!({}),
                payload_text: "{}".into(),
                priority: 0,
                run_at: now,
                attempt: 1,
                max_attempts: 25,
                timeout: None,
                created_at: now,
            },
            undecodable: None,
            last_error: None,
            token: 0,
            keys: Keys::default(),
            admitted_at: None,
            buffered: false,
            suspect: false,
            ready_for: 0.0,
            trace: None,
            inputs: None,
        }
    }
}
