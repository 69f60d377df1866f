//! The Rust producer API. Jobs are enqueued through any
//! [`GenericClient`]: a plain client (autocommit) or **the caller's own
//! transaction**, so a job is enqueued if and only if the caller's work
//! commits. Bulk enqueues are one statement, not one round trip per job,
//! sent as the unnamed statement (`query_typed`): one round trip, no named
//! prepared statement, so it works through PgBouncer in transaction mode.
//!
//! ```no_run
//! # async fn f(client: &mut tokio_postgres::Client) -> pgwake::Result<()> {
//! use pgwake::client::{enqueue, NewJob};
//! let tx = client.transaction().await.unwrap();
//! // … the caller's own writes …
//! enqueue(&tx, &NewJob::new("send_email", serde_json::json!({"to": "a@example.com"}))).await?;
//! tx.commit().await.unwrap(); // the job exists only now
//! # Ok(()) }
//! ```

use std::time::{Duration, SystemTime};

use serde::Deserialize;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

/// A job to enqueue. Unset fields take the table's defaults (queue
/// `default`, run now, priority 0, 25 attempts).
#[non_exhaustive]
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NewJob {
    /// Task name: selects the handler. Required, non-empty.
    pub task: String,
    /// JSON payload (any JSON value). Default `{}`.
    #[serde(default)]
    pub payload: Option<serde_json::Value>,
    /// Queue. Default `default`.
    #[serde(default)]
    pub queue: Option<String>,
    /// When it may run: a timestamp PostgreSQL understands, e.g.
    /// `2026-11-22T10:00:00Z`. Default now.
    #[serde(default)]
    pub run_at: Option<String>,
    /// Lower runs first. Default 0.
    #[serde(default)]
    pub priority: Option<i32>,
    /// Attempts before the job moves to `dead_jobs`. Default 25.
    #[serde(default)]
    pub max_attempts: Option<i32>,
    /// This job's timeout, e.g. `"90s"` or `"2h 30m"` (`None`: the worker's
    /// `--job-timeout`).
    #[serde(default)]
    pub timeout: Option<String>,
    /// Jobs with the same ordering key run one at a time, in (priority,
    /// run_at, id) order, a failed one keeping its place (docs/src/keys.md → Ordered
    /// keys). Default none.
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// At most one waiting job per unique key: enqueueing a duplicate
    /// returns the waiting job's id, flagged as a duplicate (docs/src/keys.md →
    /// Unique jobs). Default none.
    #[serde(default)]
    pub unique_key: Option<String>,
    /// With `unique_key`: a *running* job with the key counts too (at most
    /// one waiting-or-running); its id comes back as the duplicate. Default
    /// false.
    #[serde(default)]
    pub unique_running: Option<bool>,
    /// Who the job is for (a customer, a tenant), for its queue's per-key
    /// settings: fairness between keys (docs/src/queues.md → Limit keys).
    /// Default none: the queue's `limit_key_path` field of the payload, if
    /// the queue has one.
    #[serde(default)]
    pub limit_key: Option<String>,
    /// The producer's W3C trace context: its `traceparent`, e.g.
    /// `00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01`, kept with
    /// the job through its retries, death and history (docs/src/tracing.md).
    /// A malformed one never fails the enqueue: the database ignores it
    /// with a warning and counts it (`pgwake_trace_context_rejected`).
    /// Default none: then the current `tracing` span's context, when the
    /// `otel` feature is built and an OpenTelemetry layer makes that span an
    /// OpenTelemetry span (a request handler's span, or a job's run span:
    /// jobs enqueued by a handler join its trace); else the transaction's
    /// `SET LOCAL pgwake.traceparent`, if any.
    #[serde(default)]
    pub traceparent: Option<String>,
    /// With `traceparent`: its `tracestate` (vendors' entries, at most 512
    /// bytes; a malformed one is dropped, counted, and the traceparent kept).
    #[serde(default)]
    pub tracestate: Option<String>,
    /// The job's parents: ids of jobs it waits for. It is held until every
    /// one has ended done, and released in the commit that ends the last
    /// (docs/src/flows.md). At most 1,000; an unknown parent, or one that
    /// ended dead, cancelled or (without history showing it done) at all,
    /// fails the enqueue. Ignored for a duplicate. Default none.
    #[serde(default)]
    pub after: Option<Vec<i64>>,
    /// With `after`: what the job does when a parent ends dead or
    /// cancelled: `cancel` (the default), `run` or `wait` (for the
    /// parent's retry).
    #[serde(default)]
    pub on_parent_failure: Option<String>,
    /// The batch the job belongs to: the id `pgwake.batch_open` returned
    /// (docs/src/flows.md → "Batches"). The batch's callback runs once
    /// this job has ended, whatever its outcome. An unknown or closed
    /// batch, or one already at `pgwake.max_batch_jobs()` (100,000) jobs,
    /// fails the enqueue. Ignored for a duplicate. Default none.
    #[serde(default)]
    pub batch: Option<i64>,
    /// Run this long after the database's `now()` (not this machine's
    /// clock, which may be off). Ignored when `run_at` is set. Not read from
    /// NDJSON (use `run_at` there).
    #[serde(skip)]
    pub delay: Option<Duration>,
}

impl NewJob {
    /// A job for `task` with `payload`, other fields default.
    pub fn new(task: impl Into<String>, payload: serde_json::Value) -> NewJob {
        NewJob {
            task: task.into(),
            payload: Some(payload),
            queue: None,
            run_at: None,
            priority: None,
            max_attempts: None,
            timeout: None,
            ordering_key: None,
            unique_key: None,
            unique_running: None,
            limit_key: None,
            traceparent: None,
            tracestate: None,
            after: None,
            on_parent_failure: None,
            batch: None,
            delay: None,
        }
    }

    /// In batch `batch` (see
    /// [`NewJob::batch`](struct@NewJob#structfield.batch)).
    pub fn batch(mut self, batch: i64) -> NewJob {
        self.batch = Some(batch);
        self
    }

    /// With the producer's W3C trace context `traceparent` (see
    /// [`NewJob::traceparent`](struct@NewJob#structfield.traceparent)).
    pub fn traceparent(mut self, traceparent: impl Into<String>) -> NewJob {
        self.traceparent = Some(traceparent.into());
        self
    }

    /// Waiting for the jobs `parents` (see
    /// [`NewJob::after`](struct@NewJob#structfield.after)); added to any
    /// given before.
    pub fn after(mut self, parents: impl IntoIterator<Item = i64>) -> NewJob {
        self.after.get_or_insert_with(Vec::new).extend(parents);
        self
    }

    /// What the job does when a parent ends dead or cancelled (see
    /// [`NewJob::on_parent_failure`](struct@NewJob#structfield.on_parent_failure)).
    pub fn on_parent_failure(mut self, policy: ParentFailure) -> NewJob {
        self.on_parent_failure = Some(policy.as_str().into());
        self
    }

    /// With the trace context's `tracestate` (used with a traceparent).
    pub fn tracestate(mut self, tracestate: impl Into<String>) -> NewJob {
        self.tracestate = Some(tracestate.into());
        self
    }

    /// Run one at a time and in order with the other jobs of `key`.
    pub fn ordering_key(mut self, key: impl Into<String>) -> NewJob {
        self.ordering_key = Some(key.into());
        self
    }

    /// At most one waiting job with `key`: a duplicate is not enqueued (see
    /// [`enqueue_detailed`]).
    pub fn unique_key(mut self, key: impl Into<String>) -> NewJob {
        self.unique_key = Some(key.into());
        self
    }

    /// For limit key `key` (a customer, a tenant): the queue's per-key
    /// settings apply to it.
    pub fn limit_key(mut self, key: impl Into<String>) -> NewJob {
        self.limit_key = Some(key.into());
        self
    }

    /// On queue `queue`.
    pub fn queue(mut self, queue: impl Into<String>) -> NewJob {
        self.queue = Some(queue.into());
        self
    }

    /// Not before `after` from now, by the database's clock (`now() +
    /// after`): right even when this machine's clock is off.
    pub fn delay(mut self, after: Duration) -> NewJob {
        self.delay = Some(after);
        self
    }

    /// Not before `at`, an absolute time (compared with the database's
    /// clock; for "in 30 seconds" use [`NewJob::delay`], which does not
    /// depend on this machine's clock).
    pub fn run_at(mut self, at: SystemTime) -> NewJob {
        self.run_at = Some(humantime::format_rfc3339_micros(at).to_string());
        self
    }

    /// With priority `priority` (lower first).
    pub fn priority(mut self, priority: i32) -> NewJob {
        self.priority = Some(priority);
        self
    }

    /// With at most `max_attempts` attempts.
    pub fn max_attempts(mut self, max_attempts: i32) -> NewJob {
        self.max_attempts = Some(max_attempts);
        self
    }

    /// Give this job its own timeout, overriding the worker's
    /// `job_timeout` (in both delivery modes).
    pub fn timeout(mut self, timeout: std::time::Duration) -> NewJob {
        self.timeout = Some(humantime::format_duration(timeout).to_string());
        self
    }

    /// With [`NewJob::unique_key`]: a running job with the key is a
    /// duplicate too (at most one waiting-or-running).
    pub fn unique_running(mut self, yes: bool) -> NewJob {
        self.unique_running = Some(yes);
        self
    }

    /// The timeout in seconds, if any.
    fn timeout_secs(&self) -> Result<Option<f64>> {
        let Some(t) = &self.timeout else {
            return Ok(None);
        };
        let d = humantime::parse_duration(t).map_err(|e| {
            Error::Config(format!(
                "timeout {t:?} is not a duration like \"90s\" or \"2h 30m\": {e}"
            ))
        })?;
        if d.is_zero() {
            return Err(Error::Config("timeout must be greater than 0".into()));
        }
        if d > crate::config::JOB_TIMEOUT_MAX {
            return Err(Error::Config(format!(
                "timeout {t:?} is longer than 24 days, the most PostgreSQL's statement limit holds"
            )));
        }
        Ok(Some(d.as_secs_f64()))
    }

    /// Check what the database would reject, with a message naming the field.
    pub fn validate(&self) -> Result<()> {
        self.timeout_secs()?;
        if self.task.is_empty() {
            return Err(Error::Config("task must not be empty".into()));
        }
        if self.task.len() > 256 {
            return Err(Error::Config("task is longer than 256 bytes".into()));
        }
        if let Some(q) = &self.queue {
            crate::config::validate_queue_name(q)?;
        }
        for (name, key) in [
            ("unique_key", &self.unique_key),
            ("ordering_key", &self.ordering_key),
            ("limit_key", &self.limit_key),
        ] {
            if key
                .as_ref()
                .is_some_and(|k| k.len() > crate::config::KEY_MAX)
            {
                return Err(Error::Config(format!(
                    "{name} is longer than {} bytes",
                    crate::config::KEY_MAX
                )));
            }
        }
        if self.unique_running == Some(true) && self.unique_key.is_none() {
            return Err(Error::Config("unique_running needs a unique_key".into()));
        }
        if matches!(self.max_attempts, Some(m) if m < 1) {
            return Err(Error::Config("max_attempts must be at least 1".into()));
        }
        for (name, text) in [
            ("task", Some(&self.task)),
            ("queue", self.queue.as_ref()),
            ("ordering_key", self.ordering_key.as_ref()),
            ("unique_key", self.unique_key.as_ref()),
        ] {
            if text.is_some_and(|t| t.contains('\0')) {
                return Err(Error::Config(format!(
                    "{name} holds the character U+0000, which PostgreSQL text cannot store: remove it"
                )));
            }
        }
        if self.payload.as_ref().is_some_and(holds_nul) {
            return Err(Error::Config(
                "payload holds the character U+0000 (\\u0000) in a string or key, which PostgreSQL's jsonb cannot store: remove it, or encode the value (e.g. base64)".into(),
            ));
        }
        Ok(())
    }
}

/// Whether a JSON value holds U+0000 in any string or object key.
fn holds_nul(v: &serde_json::Value) -> bool {
    match v {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(a) => a.iter().any(holds_nul),
        serde_json::Value::Object(o) => o.iter().any(|(k, v)| k.contains('\0') || holds_nul(v)),
        _ => false,
    }
}

/// The most of a trace context value sent to the database: anything longer
/// is malformed anyway (a traceparent is 55 bytes, a tracestate at most 512)
/// and is sent cut, to be refused and counted there.
const TRACE_VALUE_SENT_MAX: usize = 1024;

/// A trace context value as PostgreSQL text can hold it, bounded: U+0000,
/// which text cannot store and which would fail the whole insert, becomes
/// U+FFFD, and a value over [`TRACE_VALUE_SENT_MAX`] bytes is cut, so the
/// database refuses the value as malformed and counts it like any other bad
/// context (functions/traces.sql) instead of failing the job.
fn storable(value: &str) -> String {
    let mut end = value.len().min(TRACE_VALUE_SENT_MAX);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].replace('\0', "\u{FFFD}")
}

/// What an enqueue did with one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Enqueued {
    /// The job's id: the new job's, or for a duplicate the id of the job
    /// that already waits with the same `unique_key`.
    pub id: i64,
    /// True when a job with the same `unique_key` was already waiting and
    /// nothing was inserted.
    pub duplicate: bool,
}

/// What a child does when one of its parents ends dead or cancelled
/// (docs/src/flows.md → Failure policy).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentFailure {
    /// The child is cancelled (with the reason in its errors), and its own
    /// children by their policies. The default.
    Cancel,
    /// The edge counts as ended: the child runs once its other parents are
    /// done.
    Run,
    /// The child keeps waiting until the parent is retried (`pgwake dead
    /// retry`) and ends done.
    Wait,
}

impl ParentFailure {
    /// The name the SQL API takes (`on_parent_failure`).
    pub fn as_str(self) -> &'static str {
        match self {
            ParentFailure::Cancel => "cancel",
            ParentFailure::Run => "run",
            ParentFailure::Wait => "wait",
        }
    }
}

/// Enqueue one job; returns its id (for a duplicate of a waiting
/// `unique_key`, the waiting job's id: [`enqueue_detailed`] says which).
pub async fn enqueue<C: GenericClient>(client: &C, job: &NewJob) -> Result<i64> {
    Ok(enqueue_detailed(client, job).await?.id)
}

/// Enqueue one job; returns its id and whether it was a duplicate.
pub async fn enqueue_detailed<C: GenericClient>(client: &C, job: &NewJob) -> Result<Enqueued> {
    let done = enqueue_many_detailed(client, std::slice::from_ref(job)).await?;
    done.into_iter()
        .next()
        .ok_or(Error::Unexpected("enqueue returned no id"))
}

/// Enqueue many jobs in one statement; returns their ids in input order.
pub async fn enqueue_many<C: GenericClient>(client: &C, jobs: &[NewJob]) -> Result<Vec<i64>> {
    Ok(enqueue_many_detailed(client, jobs)
        .await?
        .into_iter()
        .map(|e| e.id)
        .collect())
}

/// Enqueue many jobs in one statement; returns, in input order, each id
/// and whether it was a duplicate (a job with its `unique_key` was already
/// waiting, or came earlier in `jobs`).
pub async fn enqueue_many_detailed<C: GenericClient>(
    client: &C,
    jobs: &[NewJob],
) -> Result<Vec<Enqueued>> {
    for (i, job) in jobs.iter().enumerate() {
        job.validate().map_err(|e| match jobs.len() {
            1 => e,
            _ => e.at(format_args!("job {}", i + 1)),
        })?;
    }
    let task: Vec<&str> = jobs.iter().map(|j| j.task.as_str()).collect();
    let payload: Vec<Option<&serde_json::Value>> =
        jobs.iter().map(|j| j.payload.as_ref()).collect();
    let queue: Vec<Option<&str>> = jobs.iter().map(|j| j.queue.as_deref()).collect();
    let run_at: Vec<Option<&str>> = jobs.iter().map(|j| j.run_at.as_deref()).collect();
    let priority: Vec<Option<i32>> = jobs.iter().map(|j| j.priority).collect();
    let max_attempts: Vec<Option<i32>> = jobs.iter().map(|j| j.max_attempts).collect();
    let timeout: Vec<Option<f64>> = jobs
        .iter()
        .map(|j| j.timeout_secs())
        .collect::<Result<_>>()?;
    let delay: Vec<Option<f64>> = jobs
        .iter()
        .map(|j| j.delay.map(|d| d.as_secs_f64()))
        .collect();
    let ordering_key: Vec<Option<&str>> = jobs.iter().map(|j| j.ordering_key.as_deref()).collect();
    let unique_key: Vec<Option<&str>> = jobs.iter().map(|j| j.unique_key.as_deref()).collect();
    let unique_running: Vec<Option<bool>> = jobs.iter().map(|j| j.unique_running).collect();
    let limit_key: Vec<Option<&str>> = jobs.iter().map(|j| j.limit_key.as_deref()).collect();
    // A job without a context of its own takes the current span's, when an
    // OpenTelemetry layer makes it an OpenTelemetry span (feature `otel`).
    #[cfg(feature = "otel")]
    let current = crate::otel::context_of(&tracing::Span::current());
    #[cfg(not(feature = "otel"))]
    let current: Option<crate::trace::TraceContext> = None;
    let traceparent: Vec<Option<String>> = jobs
        .iter()
        .map(|j| match (&j.traceparent, &current) {
            (Some(tp), _) => Some(storable(tp)),
            (None, Some(c)) => Some(c.traceparent.clone()),
            (None, None) => None,
        })
        .collect();
    let tracestate: Vec<Option<String>> = jobs
        .iter()
        .map(|j| match (&j.traceparent, &current) {
            (Some(_), _) => j.tracestate.as_deref().map(storable),
            (None, Some(c)) => c.tracestate.clone(),
            (None, None) => None,
        })
        .collect();
    let after: Vec<Option<serde_json::Value>> = jobs
        .iter()
        .map(|j| j.after.as_ref().map(|a| serde_json::json!(a)))
        .collect();
    let on_parent_failure: Vec<Option<&str>> = jobs
        .iter()
        .map(|j| j.on_parent_failure.as_deref())
        .collect();
    let batch: Vec<Option<i64>> = jobs.iter().map(|j| j.batch).collect();
    let rows = crate::db::sql::Db::unnamed(client.client())
        .query(
            &crate::db::sql::ENQUEUE,
            &[
                &task,
                &payload,
                &queue,
                &run_at,
                &priority,
                &max_attempts,
                &delay,
                &timeout,
                &ordering_key,
                &unique_key,
                &unique_running,
                &limit_key,
                &traceparent,
                &tracestate,
                &after,
                &on_parent_failure,
                &batch,
            ],
        )
        .await
        .map_err(Error::db_insert("enqueue failed"))?;
    Ok(rows
        .iter()
        .map(|r| Enqueued {
            id: r.get(0),
            duplicate: r.get(1),
        })
        .collect())
}

/// How long a signal that wakes no job is kept for the first job that
/// begins to wait for its key (24 hours), with [`signal`].
pub const SIGNAL_KEEP_DEFAULT: Duration = Duration::from_secs(24 * 3600);

/// Longest a signal that wakes no job may be kept (7 days).
pub const SIGNAL_KEEP_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

/// Send a signal: every job waiting for `key` ([`crate::Outcome::WaitFor`])
/// is due now and gets `payload` ([`crate::JobContext::signal`]); a worker
/// waiting for work is woken. Returns how many jobs it woke. A signal that
/// wakes no job is kept for [`SIGNAL_KEEP_DEFAULT`] (24 hours): the first
/// wait for its key that begins meanwhile takes it and resumes at once.
/// The same as `SELECT pgwake.signal(key, payload)`; it commits with
/// `client`'s transaction, if it is one.
///
/// Bounds, checked before anything is sent: a key of 1 to
/// [`crate::config::KEY_MAX`] bytes without control characters, a payload
/// of at most [`crate::SIGNAL_PAYLOAD_MAX`] bytes of JSON.
pub async fn signal<C: GenericClient>(
    client: &C,
    key: &str,
    payload: Option<&serde_json::Value>,
) -> Result<i64> {
    signal_keep(client, key, payload, SIGNAL_KEEP_DEFAULT).await
}

/// [`signal`], keeping a signal that wakes no job for `keep` (at most
/// [`SIGNAL_KEEP_MAX`]; zero keeps nothing).
pub async fn signal_keep<C: GenericClient>(
    client: &C,
    key: &str,
    payload: Option<&serde_json::Value>,
    keep: Duration,
) -> Result<i64> {
    crate::job::check_signal_key(key).map_err(Error::Config)?;
    let text = payload.map(|p| p.to_string());
    if let Some(t) = &text {
        if t.len() > crate::SIGNAL_PAYLOAD_MAX {
            return Err(Error::Config(format!(
                "the signal payload is {} bytes of JSON, over the bound of {} (pgwake::SIGNAL_PAYLOAD_MAX): send a reference (an id, a path), not the data",
                t.len(),
                crate::SIGNAL_PAYLOAD_MAX
            )));
        }
    }
    if keep > SIGNAL_KEEP_MAX {
        return Err(Error::Config(format!(
            "keep {} is longer than {} (pgwake::client::SIGNAL_KEEP_MAX)",
            humantime::format_duration(keep),
            humantime::format_duration(SIGNAL_KEEP_MAX)
        )));
    }
    let row = crate::db::sql::Db::unnamed(client.client())
        .query_one(&crate::db::sql::SIGNAL, &[&key, &text, &keep.as_secs_f64()])
        .await
        .map_err(Error::db("signal"))?;
    Ok(i64::from(row.get::<_, i32>(0)))
}

/// How long a batch may stay open before the rescuer closes it
/// ([`batch_open`]'s default: 1 day).
pub const BATCH_CLOSE_WITHIN_DEFAULT: Duration = Duration::from_secs(24 * 3600);

/// The most jobs one batch may have (the database's
/// `pgwake.max_batch_jobs()`).
pub const BATCH_JOBS_MAX: i64 = 100_000;

/// A refusal of the batch functions (SQLSTATE 22023 or 54000: an unknown
/// batch, an id that is no batch, a closed batch, the bound) is a usage
/// error with the server's message and hint; anything else as
/// [`Error::db`].
fn batch_error(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> Error {
    move |source| match source.as_db_error() {
        Some(db) if matches!(db.code().code(), "22023" | "54000") => {
            Error::Config(match db.hint() {
                Some(hint) => format!("{context}: {} ({hint})", db.message()),
                None => format!("{context}: {}", db.message()),
            })
        }
        _ => Error::Db { context, source },
    }
}

/// Open a batch (docs/src/flows.md → "Batches"): enqueue its callback, a
/// job of `task` with `payload` in `queue` (`None`: `default`), held until
/// the batch is closed ([`batch_close`]) and every job of it
/// ([`NewJob::batch`](struct@NewJob#structfield.batch)) has ended, whatever
/// their outcomes; it then runs once and reads [`batch_status`]. Returns
/// the batch's id, which is the callback's job id. A batch still open after
/// `close_within` (1 second to 30 days) is closed by the rescuer. The same
/// as `SELECT pgwake.batch_open(...)`; it commits with `client`'s
/// transaction, if it is one.
pub async fn batch_open<C: GenericClient>(
    client: &C,
    task: &str,
    payload: &serde_json::Value,
    queue: Option<&str>,
    close_within: Duration,
) -> Result<i64> {
    let row = crate::db::sql::Db::unnamed(client.client())
        .query_one(
            &crate::db::sql::BATCH_OPEN,
            &[
                &task,
                &payload.to_string(),
                &queue,
                &close_within.as_secs_f64(),
            ],
        )
        .await
        .map_err(batch_error("batch open"))?;
    Ok(row.get(0))
}

/// Close batch `batch`: no job can be added any more, and the callback is
/// released at once if every job has ended, else in the commit that ends
/// the last. `false` if it was closed already (nothing changes).
pub async fn batch_close<C: GenericClient>(client: &C, batch: i64) -> Result<bool> {
    let row = crate::db::sql::Db::unnamed(client.client())
        .query_one(&crate::db::sql::BATCH_CLOSE, &[&batch])
        .await
        .map_err(batch_error("batch close"))?;
    Ok(row.get(0))
}

/// A batch's progress ([`batch_status`], `pgwake.batch_status(id)`).
#[derive(Debug, Clone, serde::Serialize, Deserialize, PartialEq)]
pub struct BatchStatus {
    /// The batch's id (its callback's job id).
    pub batch: i64,
    /// `open` (jobs may be added), `closed` (waiting for its last jobs) or
    /// `released` (every job ended: the callback was released).
    pub state: String,
    /// Where the callback is: `held`, `waiting`, `running`, `dead`,
    /// `cancelled` or `ended`.
    pub callback: String,
    /// The batch's jobs.
    pub total: i64,
    /// Jobs that ended done.
    pub done: i64,
    /// Jobs that ended dead (out of attempts, or buried).
    pub dead: i64,
    /// Jobs that were cancelled.
    pub cancelled: i64,
    /// Jobs that have not ended.
    pub pending: i64,
    /// The failed (dead or cancelled) jobs' ids, the first 1,000 by id.
    pub failed_ids: Vec<i64>,
    /// How many more failed jobs there are than `failed_ids` lists.
    pub failed_ids_omitted: i64,
}

/// Batch `batch`'s progress: counts by outcome, the failed ids (the first
/// 1,000), whether it is open, closed or released and where its callback
/// is. Once released, the counts are as they were at the release. An
/// unknown batch, or a job that is no batch, is a usage error.
pub async fn batch_status<C: GenericClient>(client: &C, batch: i64) -> Result<BatchStatus> {
    let row = crate::db::sql::Db::unnamed(client.client())
        .query_one(&crate::db::sql::BATCH_STATUS, &[&batch])
        .await
        .map_err(batch_error("batch status"))?;
    let text: String = row.get(0);
    parse_batch_status(&text)
}

/// [`BatchStatus`] from `pgwake.batch_status`'s JSON text.
pub(crate) fn parse_batch_status(text: &str) -> Result<BatchStatus> {
    serde_json::from_str(text).map_err(|e| {
        Error::Config(format!(
            "batch status: unexpected reply from pgwake.batch_status ({e})"
        ))
    })
}
