//! History and results: finished jobs kept in `pgwake.finished_jobs`
//! (migration 0006), and the maintenance service that keeps its partitions.
//!
//! ```text
//!   history_settings.keep ── NULL: off (default) ── nothing is recorded, nothing extra runs
//!        │ set by `pgwake run --keep-finished`, read by every worker (start-up, each round)
//!        ▼ on
//!   done, tx mode     ── INSERT in the claim transaction (commits with the job)   history_done.sql
//!   done, lease mode  ── DELETE lease + INSERT in one statement, token-fenced      lease_done_history.sql
//!   dead / cancelled  ── trigger on pgwake.dead_jobs (every bury path)            record_dead()
//!        │
//!   finished_jobs ── daily partitions (UTC) + DEFAULT ── Maintenance: create ahead, drop whole
//! ```
//!
//! History is a property of the database, not of one worker: every worker
//! records when the setting is on, so what a dead-letter trigger records and
//! what the claim path records agree. A worker notices a change of the
//! setting within [`MAINTENANCE_INTERVAL_DEFAULT`](crate::config::MAINTENANCE_INTERVAL_DEFAULT).

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::config::KeepFinished;
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// Apply `keep` to the database's setting (unless
/// [`KeepFinished::Unchanged`]) and return the setting now in force
/// (`None`: history off).
pub async fn apply<C: GenericClient>(db: &C, keep: KeepFinished) -> Result<Option<Duration>> {
    let secs = match keep {
        KeepFinished::Unchanged => None,
        KeepFinished::Off => Some(None),
        KeepFinished::Keep(d) => Some(Some(d.as_secs_f64())),
    };
    if let Some(secs) = secs {
        Db::unnamed(db.client())
            .execute(&sql::HISTORY_SETTINGS_SET, &[&secs])
            .await
            .map_err(Error::db("history: cannot change the setting"))?;
    }
    let row = Db::unnamed(db.client())
        .query_one(&sql::HISTORY_SETTINGS_GET, &[])
        .await
        .map_err(Error::db("history: cannot read the setting"))?;
    Ok(row.get::<_, Option<f64>>(0).map(Duration::from_secs_f64))
}

/// How many finished jobs [`list`] shows when not told otherwise.
pub const LIST_LIMIT_DEFAULT: i64 = 50;

/// Which finished jobs [`list`] shows.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    /// This queue only.
    pub queue: Option<String>,
    /// This task only.
    pub task: Option<String>,
    /// `done`, `dead` or `cancelled` only.
    pub outcome: Option<String>,
    /// Finished within this long before now (database clock).
    pub since: Option<Duration>,
    /// Finished at or after this moment.
    pub since_time: Option<SystemTime>,
    /// At most this many, newest first.
    pub limit: i64,
    /// Only those that sort after this one (newest first): the next page.
    pub after: Option<After>,
}

/// Where a page of [`list_page`] ends: the last row's finish time and id
/// (`pgwake history --after`), written `RFC3339/ID` with microseconds, e.g.
/// `2026-11-27T23:01:02.123456Z/42`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct After {
    /// The row's `finished_at`.
    pub finished_at: SystemTime,
    /// The row's job id.
    pub id: i64,
}

impl std::fmt::Display for After {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}",
            humantime::format_rfc3339_micros(self.finished_at),
            self.id
        )
    }
}

impl std::str::FromStr for After {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<After, String> {
        let bad = || {
            format!(
                "{s:?}: expected TIME/ID as the previous page printed it, e.g. 2026-11-27T23:01:02.123456Z/42"
            )
        };
        let (t, id) = s.rsplit_once('/').ok_or_else(bad)?;
        Ok(After {
            finished_at: humantime::parse_rfc3339(t).map_err(|_| bad())?,
            id: id.parse().map_err(|_| bad())?,
        })
    }
}

/// One page of finished jobs: the rows, and where the next page starts
/// (`None`: no more rows).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    /// At most `limit` rows, newest first.
    pub rows: Vec<FinishedJob>,
    /// `--after` for the next page, when more rows match.
    pub next: Option<After>,
}

/// The outcomes a finished job can have.
pub const OUTCOMES: &[&str] = &["done", "dead", "cancelled"];

/// A row of `pgwake.finished_jobs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FinishedJob {
    /// Job id.
    pub id: i64,
    /// Queue.
    pub queue: String,
    /// Task.
    pub task: String,
    /// The payload (embedded as JSON).
    #[serde(serialize_with = "raw_json")]
    pub payload: String,
    /// `done`, `dead` or `cancelled`.
    pub outcome: String,
    /// The result (embedded as JSON), if any.
    #[serde(serialize_with = "raw_json_opt")]
    pub result: Option<String>,
    /// The last error of a dead or cancelled job.
    pub error: Option<String>,
    /// Attempts used, the finishing one included.
    pub attempts: i32,
    /// When it was enqueued (RFC 3339).
    pub enqueued_at: String,
    /// When its finishing run was claimed (RFC 3339), if known.
    pub started_at: Option<String>,
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// The worker that ran it, if known.
    pub worker: Option<String>,
    /// `finished_at` to the microsecond (the paging cursor).
    #[serde(skip)]
    pub finished: SystemTime,
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Finished jobs, newest first.
pub async fn list<C: GenericClient>(db: &C, filter: &Filter) -> Result<Vec<FinishedJob>> {
    Ok(list_page(db, filter).await?.rows)
}

/// A page of finished jobs, newest first, and whether more match (one row
/// more is read to know).
pub async fn list_page<C: GenericClient>(db: &C, filter: &Filter) -> Result<Page> {
    if let Some(o) = &filter.outcome {
        if !OUTCOMES.contains(&o.as_str()) {
            return Err(Error::Config(format!(
                "--outcome {o:?}: expected done, dead or cancelled"
            )));
        }
    }
    let since = filter.since.map(|d| d.as_secs_f64());
    let after_time = filter.after.map(|a| a.finished_at);
    let after_id = filter.after.map(|a| a.id);
    let read = filter.limit.saturating_add(1);
    let rows = Db::unnamed(db.client())
        .query(
            &sql::HISTORY_LIST,
            &[
                &filter.queue,
                &filter.task,
                &filter.outcome,
                &read,
                &since,
                &filter.since_time,
                &after_time,
                &after_id,
            ],
        )
        .await
        .map_err(Error::db("cannot list finished jobs"))?;
    let mut rows: Vec<FinishedJob> = rows
        .iter()
        .map(|r| FinishedJob {
            id: r.get(0),
            queue: r.get(1),
            task: r.get(2),
            payload: r.get(3),
            outcome: r.get(4),
            result: r.get(5),
            error: r.get(6),
            attempts: r.get(7),
            enqueued_at: rfc3339(r.get(8)),
            started_at: r.get::<_, Option<SystemTime>>(9).map(rfc3339),
            finished_at: rfc3339(r.get(10)),
            worker: r.get(11),
            finished: r.get(10),
        })
        .collect();
    let more = rows.len() as i64 > filter.limit;
    rows.truncate(filter.limit.max(0) as usize);
    let next = rows.last().filter(|_| more).map(|r| After {
        finished_at: r.finished,
        id: r.id,
    });
    Ok(Page { rows, next })
}

/// Serialize stored JSON text as JSON (as a string if it cannot be re-read,
/// e.g. nested deeper than serde's limit).
fn raw_json<S: serde::Serializer>(text: &str, s: S) -> std::result::Result<S::Ok, S::Error> {
    match serde_json::value::RawValue::from_string(text.to_string()) {
        Ok(raw) => raw.serialize(s),
        Err(_) => s.serialize_str(text),
    }
}

fn raw_json_opt<S: serde::Serializer>(
    text: &Option<String>,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    match text {
        Some(t) => raw_json(t, s),
        None => s.serialize_none(),
    }
}
