//! A job's W3C trace context ([`TraceContext`]), as producers store it
//! (`pgwake.job_traces`, docs/src/tracing.md) and as handlers get it
//! ([`JobContext::trace`](crate::JobContext::trace)). What the claim path
//! does with it — reading it per claim, the job's spans — is
//! `claim::run::trace`.

/// A W3C trace context: a `traceparent` and its optional `tracestate`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    /// Version 00 `traceparent`: `00-<trace id>-<parent span id>-<flags>`
    /// (55 characters, checked when it was stored).
    pub traceparent: String,
    /// Vendors' entries, at most 512 bytes, if the producer gave any.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The trace id: the 32 hexadecimal digits after the version; empty
    /// if the `traceparent` is not the 55 characters of version 00.
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or("")
    }
}
