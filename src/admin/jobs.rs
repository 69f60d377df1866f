//! Looking at jobs: list them in every state with filters, show one, and
//! say why a job is not running (`functions/jobs.sql`: `pgwake.list_jobs`,
//! `pgwake.explain`). The command line (`pgwake jobs list`, `pgwake job
//! show`, `pgwake explain`) and the console read the same functions.

use serde::Serialize;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Every reason `pgwake.explain` gives (`functions/jobs.sql`). The book lists each one where it
/// explains the answer (`docs/src/sql.md`, `console.md`, `cli.md`), and
/// `tests/repository/docs.rs` holds the function, this list and those
/// pages to the same set.
pub const REASONS: &[&str] = &[
    "running",
    "progress",
    "process_wait",
    "buffered",
    "locked",
    "scheduled",
    "snoozed",
    "sleeping",
    "waiting_for_signal",
    "retry_backoff",
    "paused",
    "waiting_for_parents",
    "ordering_key",
    "max_running",
    "rate_limit",
    "key_max_running",
    "key_rate_limit",
    "no_worker",
    "no_handler",
    "saturated",
    "ready",
    "dead",
    "cancelled",
    "not_found",
];

/// One reason a job is not running, and what ends it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Reason {
    /// One of [`REASONS`] (`running`, then maybe `progress`: what its
    /// handler last reported, and `process_wait`: its worker's persistent
    /// handler had jobs waiting for a free process; `docs/src/sql.md`).
    pub reason: String,
    /// What holds it and what will end it, in words.
    pub detail: String,
    /// When it ends by itself, if known (database clock, RFC 3339).
    pub until: Option<String>,
    /// The job it waits for (ordering key) or one holding its queue's slots.
    pub blocking_job: Option<i64>,
}

/// `pgwake.explain(id)`: why job `id` is not running, most decisive first.
pub async fn explain(client: &tokio_postgres::Client, id: i64) -> Result<Vec<Reason>> {
    let rows = Db::unnamed(client)
        .query(&sql::EXPLAIN, &[&id])
        .await
        .map_err(Error::db("explain"))?;
    Ok(rows
        .iter()
        .map(|r| Reason {
            reason: r.get(0),
            detail: r.get(1),
            until: r
                .get::<_, Option<chrono::DateTime<chrono::Utc>>>(2)
                .map(|t| t.to_rfc3339()),
            blocking_job: r.get(3),
        })
        .collect())
}

/// Which jobs [`list`] returns; `None` fields match anything.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    /// `waiting`, `scheduled`, `running`, `dead`, `cancelled` or
    /// `finished` (history); `None`: every state but finished.
    pub state: Option<String>,
    /// Queue name.
    pub queue: Option<String>,
    /// Task name.
    pub task: Option<String>,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// Unique key.
    pub unique_key: Option<String>,
    /// Jobs whose payload contains this JSON (`@>`), e.g. `{"customer": 42}`.
    pub payload: Option<serde_json::Value>,
    /// Only jobs enqueued (waiting, scheduled, running), failed or
    /// cancelled (dead, cancelled) or finished (history) at or after this.
    pub since: Option<chrono::DateTime<chrono::Utc>>,
    /// Only ids above this (the last id of the previous page).
    pub after_id: i64,
    /// At most this many (1 to 1000).
    pub page: i32,
}

/// One job in a listing.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobRow {
    /// Its id.
    pub id: i64,
    /// `waiting`, `scheduled`, `running`, `dead`, `cancelled`, or a
    /// finished outcome (`done`, `dead`, `cancelled`) for history rows.
    pub state: String,
    /// Queue.
    pub queue: String,
    /// Task.
    pub task: String,
    /// Priority (lower first); none for history rows.
    pub priority: Option<i32>,
    /// Attempts so far.
    pub attempts: i32,
    /// Attempts it gets; none for history rows.
    pub max_attempts: Option<i32>,
    /// When it may run (RFC 3339); none for history rows.
    pub run_at: Option<String>,
    /// When it was enqueued (RFC 3339).
    pub created_at: String,
    /// Ordering key.
    pub ordering_key: Option<String>,
    /// Unique key.
    pub unique_key: Option<String>,
    /// Limit key (migration 0020).
    pub limit_key: Option<String>,
    /// The worker running (or that finished) it.
    pub worker: Option<String>,
    /// Its last error.
    pub last_error: Option<String>,
}

fn time(t: Option<chrono::DateTime<chrono::Utc>>) -> Option<String> {
    t.map(|t| t.to_rfc3339())
}

/// Jobs matching `filter`, by id ascending (`pgwake.list_jobs`). An unknown
/// state is refused naming the states.
pub async fn list(client: &tokio_postgres::Client, filter: &JobFilter) -> Result<Vec<JobRow>> {
    let payload = filter.payload.as_ref().map(|p| p.to_string());
    let rows = if filter.state.as_deref() == Some("finished") {
        // The history alone: a plain statement reads the partitions' id
        // indexes in order (src/db/sql/list_finished.sql says why).
        Db::unnamed(client)
            .query(
                &sql::LIST_FINISHED,
                &[
                    &filter.after_id,
                    &filter.queue,
                    &filter.task,
                    &filter.unique_key,
                    &payload,
                    &filter.page,
                    &filter.since,
                ],
            )
            .await
            .map_err(Error::db("listing finished jobs"))?
    } else {
        Db::unnamed(client)
            .query(
                &sql::LIST_JOBS,
                &[
                    &filter.state,
                    &filter.queue,
                    &filter.task,
                    &filter.ordering_key,
                    &filter.unique_key,
                    &payload,
                    &filter.after_id,
                    &filter.page,
                    &filter.since,
                ],
            )
            .await
            .map_err(|e| match e.code().map(|c| c.code()) {
                Some("22023") => Error::Config(
                    e.as_db_error()
                        .map(|d| d.message().to_string())
                        .unwrap_or_default(),
                ),
                _ => Error::db("listing jobs")(e),
            })?
    };
    Ok(rows
        .iter()
        .map(|r| JobRow {
            id: r.get(0),
            state: r.get(1),
            queue: r.get(2),
            task: r.get(3),
            priority: r.get(4),
            attempts: r.get(5),
            max_attempts: r.get(6),
            run_at: time(r.get(7)),
            created_at: time(r.get(8)).unwrap_or_default(),
            ordering_key: r.get(9),
            unique_key: r.get(10),
            worker: r.get(11),
            last_error: r.get(12),
            limit_key: r.get(13),
        })
        .collect())
}

/// One history row of a job (history on).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HistoryEntry {
    /// `done`, `dead` or `cancelled`.
    pub outcome: String,
    /// Attempts it took.
    pub attempts: i32,
    /// When the finishing run was claimed (RFC 3339).
    pub started_at: Option<String>,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// The worker that finished it.
    pub worker: Option<String>,
    /// The error (dead, cancelled).
    pub error: Option<String>,
    /// The result, pretty-printed JSON (done).
    pub result: Option<String>,
}

/// One failed attempt's error (`pgwake.job_errors`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AttemptError {
    /// The attempt that failed.
    pub attempt: i32,
    /// Its error.
    pub error: String,
    /// When it was recorded (RFC 3339).
    pub at: String,
}

/// How often a job's handler snoozed it ([`crate::Outcome::Snooze`];
/// `pgwake.job_snoozes`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Snoozes {
    /// Snoozes in all (none of them used an attempt).
    pub count: i32,
    /// The run_at the last snooze gave it (RFC 3339).
    pub last_until: String,
    /// When the last snooze was taken (RFC 3339).
    pub last_at: String,
}

/// What a running job last reported of its progress, in its current run
/// ([`crate::JobContext::progress`]; `pgwake.job_progress`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Progress {
    /// The value, as JSON text (at most [`crate::PROGRESS_VALUE_MAX`] bytes).
    pub value: String,
    /// Its message, if any.
    pub message: Option<String>,
    /// When the worker wrote it (RFC 3339): within `--progress-interval`
    /// of the report.
    pub at: String,
}

/// The progress of each of `ids` that runs and reported some in its
/// current run, by job id. The progress of a run that is over (its worker
/// died, its lease was lost) is never returned, even before its row goes.
pub async fn progress(
    client: &tokio_postgres::Client,
    ids: &[i64],
) -> Result<std::collections::HashMap<i64, Progress>> {
    if ids.is_empty() {
        return Ok(Default::default());
    }
    Ok(Db::unnamed(client)
        .query(&sql::JOB_PROGRESS, &[&ids])
        .await
        .map_err(Error::db("reading the progress"))?
        .iter()
        .map(|r| {
            (
                r.get(0),
                Progress {
                    value: r.get(1),
                    message: r.get(2),
                    at: time(r.get(3)).unwrap_or_default(),
                },
            )
        })
        .collect())
}

/// A step a job's handler finished and recorded
/// ([`crate::JobContext::step`]; `pgwake.job_steps`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Step {
    /// Its name (ASCII letters, digits and `_ . : -`).
    pub name: String,
    /// Its output, as JSON text (at most [`crate::STEP_OUTPUT_MAX`] bytes).
    pub output: String,
    /// The attempt that recorded it.
    pub attempt: i32,
    /// When it was recorded (RFC 3339).
    pub at: String,
}

/// Job `id`'s recorded steps, oldest first. A tx-mode run's steps show
/// once its claim transaction commits (with its outcome).
pub async fn steps(client: &tokio_postgres::Client, id: i64) -> Result<Vec<Step>> {
    Ok(Db::unnamed(client)
        .query(&sql::STEPS_OF_JOB, &[&id])
        .await
        .map_err(Error::db("reading the steps"))?
        .iter()
        .map(|r| Step {
            name: r.get(0),
            output: r.get(1),
            attempt: r.get(2),
            at: time(r.get(3)).unwrap_or_default(),
        })
        .collect())
}

/// A job's W3C trace context, as its producer gave it
/// (docs/src/tracing.md).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TraceContext {
    /// Its `traceparent`: `00-<trace id>-<parent span id>-<flags>`.
    pub traceparent: String,
    /// Its `tracestate`, if the producer gave one.
    pub tracestate: Option<String>,
}

impl TraceContext {
    /// The trace id: the 32 hex digits after the version (the database
    /// keeps only valid traceparents, 55 characters).
    pub fn trace_id(&self) -> &str {
        self.traceparent.get(3..35).unwrap_or_default()
    }
}

/// How many of a job's parents, and of its children, [`show`] returns (the
/// rest are counted: [`Relatives::total`]).
pub const RELATIVES_SHOWN: i64 = 50;

/// A parent or child of a job (an edge of a flow, `pgwake.job_parents`;
/// docs/src/flows.md).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Relative {
    /// Its id.
    pub id: i64,
    /// Its task; `None` when it is gone and the history does not show it.
    pub task: Option<String>,
    /// Where it is: `running`, `waiting`, `scheduled`, `held` (waiting for
    /// its own parents), `dead`, `cancelled`, `done` (or another outcome
    /// its newest history row gives), or `unknown` (gone, and nothing says
    /// how it ended).
    pub state: String,
    /// The edge's policy, what the child does when this parent ends dead
    /// or cancelled: `cancel`, `run` or `wait`.
    pub on_failure: String,
    /// The edge's state: `open` (the parent has not ended), `done` (it
    /// ended done, or failed under `run`), `failed` (it ended dead or
    /// cancelled; the child waits for a retry or was cancelled).
    pub edge: String,
}

impl Relative {
    /// Its state in words: `held` is "held for its own parents".
    pub fn state_words(&self) -> &str {
        match self.state.as_str() {
            "held" => "held for its own parents",
            s => s,
        }
    }
}

/// One side of a job's edges: the first [`RELATIVES_SHOWN`] by id, and how
/// many there are.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Relatives {
    /// The first ones, by id.
    pub shown: Vec<Relative>,
    /// How many there are in all.
    pub total: i64,
}

impl Relatives {
    /// How many there are beyond those shown.
    pub fn more(&self) -> i64 {
        (self.total - self.shown.len() as i64).max(0)
    }
}

/// Job `id`'s parents and children (each side the first `limit` by id,
/// with its count). Edges go when a child has run and the rescuer swept
/// them (functions/flows.sql), so a child that ran may no longer list its
/// parents.
pub async fn relatives(
    client: &tokio_postgres::Client,
    id: i64,
    limit: i64,
) -> Result<(Relatives, Relatives)> {
    let rows = Db::unnamed(client)
        .query(&sql::JOB_RELATIVES, &[&id, &limit.clamp(0, 1000)])
        .await
        .map_err(Error::db("reading the parents and children"))?;
    let mut parents = Relatives::default();
    let mut children = Relatives::default();
    for r in &rows {
        parents.total = r.get(6);
        children.total = r.get(7);
        let side: &str = r.get(0);
        let relative = Relative {
            id: r.get(1),
            task: r.get(2),
            state: r.get(3),
            on_failure: r.get(4),
            edge: r.get(5),
        };
        match side {
            "parent" => parents.shown.push(relative),
            _ => children.shown.push(relative),
        }
    }
    Ok((parents, children))
}

/// Everything about one job.
#[non_exhaustive]
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct JobDetail {
    /// Where it is now; when only its history remains, its newest history
    /// row (the state its latest run left it in); `None` when neither.
    pub job: Option<JobRow>,
    /// Its payload, pretty-printed by the server (numbers exactly as
    /// stored).
    pub payload: Option<String>,
    /// Its history rows, oldest first (history on).
    pub history: Vec<HistoryEntry>,
    /// Every failed attempt's error, by attempt (kept seven days).
    pub errors: Vec<AttemptError>,
    /// Its snoozes, if its handler ever snoozed it.
    pub snoozes: Option<Snoozes>,
    /// What it last reported of its progress, while it runs.
    pub progress: Option<Progress>,
    /// The steps its handler finished and recorded, oldest first (kept
    /// while the job waits, runs, is dead or in the history).
    pub steps: Vec<Step>,
    /// Its producer's trace context, if it was enqueued with one (kept
    /// while the job waits, runs, is dead or in the history).
    pub trace: Option<TraceContext>,
    /// The jobs it waits for (its parents in a flow), the first
    /// [`RELATIVES_SHOWN`] by id.
    pub parents: Relatives,
    /// The jobs that wait for it (its children in a flow), the first
    /// [`RELATIVES_SHOWN`] by id.
    pub children: Relatives,
    /// Why it is not running ([`explain`]).
    pub explanation: Vec<Reason>,
    /// Whether history is on (its finishing run will be recorded).
    pub history_on: bool,
}

impl JobDetail {
    /// History is on and the job has not finished (it waits, is scheduled
    /// or runs): its history row comes when it finishes. Pages say "not
    /// finished yet" rather than "no history".
    pub fn not_finished_yet(&self) -> bool {
        self.history_on
            && self.job.as_ref().is_some_and(|j| {
                !matches!(j.state.as_str(), "done" | "dead" | "cancelled" | "finished")
            })
    }
}

/// Every recorded error of job `id`, by attempt (kept seven days).
pub async fn errors(client: &tokio_postgres::Client, id: i64) -> Result<Vec<AttemptError>> {
    Ok(Db::unnamed(client)
        .query(&sql::JOB_ERRORS, &[&id])
        .await
        .map_err(Error::db("reading the errors"))?
        .iter()
        .map(|r| AttemptError {
            attempt: r.get(0),
            error: r.get(1),
            at: time(r.get(2)).unwrap_or_default(),
        })
        .collect())
}

/// Everything about job `id`; `None` when nothing is known of it.
pub async fn show(client: &tokio_postgres::Client, id: i64) -> Result<Option<JobDetail>> {
    let filter = |state: Option<&str>| JobFilter {
        state: state.map(str::to_string),
        after_id: id - 1,
        page: 1,
        ..JobFilter::default()
    };
    let mut job = list(client, &filter(None))
        .await?
        .into_iter()
        .find(|j| j.id == id);
    let from_history = job.is_none();
    if from_history {
        job = list(client, &filter(Some("finished")))
            .await?
            .into_iter()
            .find(|j| j.id == id);
    }
    let payload: Option<String> = Db::unnamed(client)
        .query(&sql::JOB_PAYLOAD, &[&id])
        .await
        .map_err(Error::db("reading the payload"))?
        .first()
        .and_then(|r| r.get(0));
    let history: Vec<HistoryEntry> = Db::unnamed(client)
        .query(&sql::JOB_HISTORY, &[&id])
        .await
        .map_err(Error::db("reading the history"))?
        .iter()
        .map(|r| HistoryEntry {
            outcome: r.get(0),
            attempts: r.get(1),
            started_at: time(r.get(2)),
            finished_at: time(r.get(3)).unwrap_or_default(),
            worker: r.get(4),
            error: r.get(5),
            result: r.get(6),
        })
        .collect();
    // A job that finished more than once (cancelled, retried, then done)
    // has a history row per finish: it is where its newest run left it.
    let newest = history.last();
    if let (Some(j), Some(h), true) = (job.as_mut(), newest, from_history) {
        j.state = h.outcome.clone();
        j.attempts = h.attempts;
        j.worker = h.worker.clone();
        j.last_error = h.error.clone();
    }
    let errors = errors(client, id).await?;
    if job.is_none() && payload.is_none() && history.is_empty() && errors.is_empty() {
        return Ok(None);
    }
    let explanation = explain(client, id).await?;
    let history_on = Db::unnamed(client)
        .query_one(&sql::HISTORY_SETTINGS_GET, &[])
        .await
        .map_err(Error::db("reading the history setting"))?
        .get::<_, Option<f64>>(0)
        .is_some();
    let snoozes = Db::unnamed(client)
        .query(&sql::JOB_SNOOZES, &[&id])
        .await
        .map_err(Error::db("reading the snoozes"))?
        .first()
        .map(|r| Snoozes {
            count: r.get(0),
            last_until: time(r.get(1)).unwrap_or_default(),
            last_at: time(r.get(2)).unwrap_or_default(),
        });
    let progress = progress(client, &[id]).await?.remove(&id);
    let steps = steps(client, id).await?;
    let trace = Db::unnamed(client)
        .query(&sql::JOB_TRACE, &[&id])
        .await
        .map_err(Error::db("reading the trace context"))?
        .first()
        .map(|r| TraceContext {
            traceparent: r.get(0),
            tracestate: r.get(1),
        });
    let (parents, children) = relatives(client, id, RELATIVES_SHOWN).await?;
    Ok(Some(JobDetail {
        job,
        payload,
        history,
        errors,
        snoozes,
        progress,
        steps,
        trace,
        parents,
        children,
        explanation,
        history_on,
    }))
}
