//! Jobs' trace context on the claim path (issue 39, item 2): when
//! [`WorkerConfig::trace_jobs`](crate::WorkerConfig::trace_jobs) is on, a
//! claim reads its jobs' stored W3C contexts (`pgwake.job_traces`, one
//! statement per claim), and each job gets a `pgwake.job` span — parented on
//! its producer's context when the `otel` feature is built — with a
//! `pgwake.run` span around its handler (a Rust handler's own spans nest
//! under it) and a `pgwake.outcome` span until its outcome is committed.
//! Off (the default), the claim path does none of it: no statement, no
//! span.
//!
//! What a handler sees ([`JobContext::traceparent`](crate::JobContext::traceparent)):
//! the run span's context when spans are exported, so what the handler
//! does nests under the run; otherwise the producer's context as stored.
//! `exec` commands get it as `TRACEPARENT` (and `TRACESTATE`), persistent
//! processes in the job message, `sql` functions as the settings
//! `pgwake.traceparent` and `pgwake.tracestate` of their call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use crate::claim::run::claimed::{Claimed, JobTrace};
use crate::db::sql::{Db, JOB_TRACES};
use crate::job::Resolution;
use crate::trace::TraceContext;

/// Read the stored contexts of `claimed` (one statement) and give every job
/// its [`JobTrace`]. `sent`: when the claim statement was sent (the
/// `pgwake.claim` span's start). A failed read leaves the jobs without
/// their producers' contexts (logged): tracing never stops a claim.
pub(crate) async fn attach(db: Db<'_>, claimed: &mut [Claimed], sent: Instant, mode: &'static str) {
    if claimed.is_empty() {
        return;
    }
    let ids: Vec<i64> = claimed.iter().map(|c| c.job.id).collect();
    let mut contexts: HashMap<i64, TraceContext> = HashMap::new();
    match db.query(&JOB_TRACES, &[&ids]).await {
        Ok(rows) => {
            for row in rows {
                contexts.insert(
                    row.get(0),
                    TraceContext {
                        traceparent: row.get(1),
                        tracestate: row.get(2),
                    },
                );
            }
        }
        Err(e) => tracing::warn!(
            error = %e,
            jobs = ids.len(),
            "cannot read the claimed jobs' trace contexts: their spans start new traces"
        ),
    }
    let claim_started = SystemTime::now()
        .checked_sub(sent.elapsed())
        .unwrap_or_else(SystemTime::now);
    for c in claimed {
        let producer = contexts.remove(&c.job.id);
        let span = job_span(c, producer.as_ref(), mode);
        #[cfg(feature = "otel")]
        crate::otel::claim_span(&span, claim_started);
        #[cfg(not(feature = "otel"))]
        let _ = claim_started;
        c.trace = Some(Arc::new(JobTrace {
            producer,
            span,
            outcome: Mutex::new(None),
        }));
    }
}

fn job_span(c: &Claimed, producer: Option<&TraceContext>, mode: &'static str) -> tracing::Span {
    let job = &c.job;
    let span = tracing::info_span!(
        target: "pgwake::job",
        "pgwake.job",
        job.id = job.id,
        trace_id = producer.map(TraceContext::trace_id).unwrap_or(""),
        pgwake.queue = %job.queue,
        pgwake.task = %job.task,
        pgwake.attempt = job.attempt,
        pgwake.max_attempts = job.max_attempts,
        pgwake.delivery = mode,
        pgwake.wait_ms = (c.ready_for * 1000.0).round() as i64,
        pgwake.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
    );
    #[cfg(feature = "otel")]
    if let Some(p) = producer {
        crate::otel::set_parent(&span, p);
        // With the exporter on, the job span's own trace id is the
        // producer's: what the log lines say is what the backend shows.
    }
    span
}

/// The span around one run of the handler (`pgwake.run`, a child of the job
/// span), and the context the handler is given: the run span's own when
/// spans are exported, else the producer's. `Span::none()` and `None`
/// without tracing.
pub(crate) fn run_span(claimed: &Claimed) -> (tracing::Span, Option<TraceContext>) {
    let Some(t) = &claimed.trace else {
        return (tracing::Span::none(), None);
    };
    let span = tracing::info_span!(target: "pgwake::job", parent: &t.span, "pgwake.run");
    #[cfg(feature = "otel")]
    if let Some(own) = crate::otel::context_of(&span) {
        return (span, Some(own));
    }
    (span, t.producer.clone())
}

/// The run has ended: the `pgwake.outcome` span starts, until [`ended`].
pub(crate) fn run_ended(claimed: &Claimed) {
    if let Some(t) = &claimed.trace {
        let span = tracing::info_span!(target: "pgwake::job", parent: &t.span, "pgwake.outcome");
        *t.outcome.lock().unwrap_or_else(|e| e.into_inner()) = Some(span);
    }
}

/// The outcome is committed (or the job is handed back): record it on the
/// job span and close the outcome span. The job span closes when the last
/// handle of the claimed job is dropped, right after.
pub(crate) fn ended(claimed: &Claimed, resolution: &Resolution) {
    let Some(t) = &claimed.trace else { return };
    t.span.record("pgwake.outcome", resolution.label());
    if let Some(reason) = resolution.reason() {
        t.span.record("otel.status_code", "error");
        t.span.record("otel.status_description", reason);
    }
    t.outcome.lock().unwrap_or_else(|e| e.into_inner()).take();
}
