//! Recurring jobs, the Rust API: define, list and remove schedules. Every
//! path (this API, `pgwake schedule …`, SQL) goes through the SQL functions
//! of `functions/schedules.sql`, so definitions are validated the same way;
//! this API validates first with the worker's own cron evaluator, so what it
//! accepts a worker can serve. The schedulers of running workers
//! (the scheduler service) enqueue each tick exactly once.
//!
//! ```no_run
//! # async fn f(client: &tokio_postgres::Client) -> Result<(), pgwake::admin::schedules::ScheduleError> {
//! use pgwake::admin::schedules::{self, CatchUp, NewSchedule};
//! let nightly = NewSchedule::new("nightly-report", "0 3 * * *", "build_report")
//!     .tz("Europe/Berlin")
//!     .payload(serde_json::json!({"format": "pdf"}))
//!     .catch_up(CatchUp::Missed(2));
//! schedules::add(client, &nightly).await?;
//! for s in schedules::list(client).await? {
//!     println!("{} next at {:?}", s.name, s.next_tick);
//! }
//! schedules::remove(client, "nightly-report").await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::error::SqlState;
use tokio_postgres::GenericClient;

use crate::admin::cron::{CronError, CronSchedule};
use crate::db::sql::{self, Db};
use crate::error::Error;

/// Longest schedule name, in bytes (the schema's CHECK agrees).
pub const NAME_MAX: usize = 128;
/// Largest `--catch-up N`.
pub const CATCH_UP_MAX: u32 = 1000;
/// Default time zone of a schedule.
pub const TZ_DEFAULT: &str = "UTC";

/// What a schedule does with ticks missed while no worker ran.
///
/// The latest due tick is always enqueued, late, once (a restart across a
/// tick loses nothing); the policy decides about the ticks before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Drop them (counted as missed). The default.
    #[default]
    Skip,
    /// Also enqueue the newest `n` of them (1 ..= [`CATCH_UP_MAX`]), oldest
    /// first; drop the rest.
    Missed(u32),
}

impl CatchUp {
    /// Missed ticks to enqueue besides the latest due one.
    pub fn extra_ticks(self) -> u32 {
        match self {
            CatchUp::Skip => 0,
            CatchUp::Missed(n) => n,
        }
    }
}

impl fmt::Display for CatchUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CatchUp::Skip => f.write_str("skip"),
            CatchUp::Missed(n) => write!(f, "{n}"),
        }
    }
}

impl FromStr for CatchUp {
    type Err = String;

    fn from_str(s: &str) -> Result<CatchUp, String> {
        match s {
            "skip" => Ok(CatchUp::Skip),
            n => match n.parse::<u32>() {
                Ok(n) if (1..=CATCH_UP_MAX).contains(&n) => Ok(CatchUp::Missed(n)),
                _ => Err(format!(
                    "{s:?} is neither skip nor a number of missed ticks from 1 to {CATCH_UP_MAX}"
                )),
            },
        }
    }
}

impl Serialize for CatchUp {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The part of a definition a problem is about; [`Field::flag`] names the
/// command-line flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// The schedule's name.
    Name,
    /// The cron expression.
    Cron,
    /// The task.
    Task,
    /// The payload.
    Payload,
    /// The queue.
    Queue,
    /// The time zone.
    Tz,
    /// The catch-up policy.
    CatchUp,
}

impl Field {
    /// The `pgwake schedule add` flag.
    pub fn flag(self) -> &'static str {
        match self {
            Field::Name => "--name",
            Field::Cron => "--cron",
            Field::Task => "--task",
            Field::Payload => "--payload",
            Field::Queue => "--queue",
            Field::Tz => "--tz",
            Field::CatchUp => "--catch-up",
        }
    }

    fn of_sql_message(message: &str) -> Field {
        match message.split(':').next().unwrap_or_default() {
            "name" => Field::Name,
            "task" => Field::Task,
            "queue" => Field::Queue,
            "payload" => Field::Payload,
            "tz" => Field::Tz,
            "catch_up" => Field::CatchUp,
            _ => Field::Cron,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.flag().trim_start_matches('-'))
    }
}

/// Why a schedule operation failed.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// A field of the definition is invalid.
    #[error("{field}: {reason}")]
    Invalid {
        /// Which field.
        field: Field,
        /// What is wrong and what would be right.
        reason: String,
    },
    /// `add` with a name that is taken.
    #[error("a schedule named {0:?} already exists; remove it first or add it with --replace")]
    Exists(String),
    /// `remove` of a name that is not there.
    #[error("no schedule named {0:?} (see `pgwake schedule list`)")]
    NotFound(String),
    /// The database failed.
    #[error(transparent)]
    Db(#[from] Error),
}

impl ScheduleError {
    fn invalid(field: Field, reason: impl Into<String>) -> ScheduleError {
        ScheduleError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// A schedule to add.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSchedule {
    /// Unique name (1–128 bytes, no control characters).
    pub name: String,
    /// 5-field crontab or 6 fields with seconds first; see [`crate::admin::cron`].
    pub cron: String,
    /// Task of the enqueued jobs.
    pub task: String,
    /// Payload of every enqueued job. Default `{}`.
    pub payload: serde_json::Value,
    /// Queue of the enqueued jobs. Default `default`.
    pub queue: Option<String>,
    /// Priority of the enqueued jobs (lower first). Default 0.
    pub priority: i32,
    /// IANA zone the expression is read in. Default [`TZ_DEFAULT`].
    pub tz: String,
    /// What to do with ticks missed during downtime. Default skip.
    pub catch_up: CatchUp,
}

impl NewSchedule {
    /// Enqueue `task` at every tick of `cron` (UTC, empty payload, queue
    /// `default`, priority 0, catch-up skip).
    pub fn new(
        name: impl Into<String>,
        cron: impl Into<String>,
        task: impl Into<String>,
    ) -> NewSchedule {
        NewSchedule {
            name: name.into(),
            cron: cron.into(),
            task: task.into(),
            payload: serde_json::json!({}),
            queue: None,
            priority: 0,
            tz: TZ_DEFAULT.into(),
            catch_up: CatchUp::Skip,
        }
    }

    /// With this payload.
    pub fn payload(mut self, payload: serde_json::Value) -> NewSchedule {
        self.payload = payload;
        self
    }

    /// On this queue.
    pub fn queue(mut self, queue: impl Into<String>) -> NewSchedule {
        self.queue = Some(queue.into());
        self
    }

    /// With this priority.
    pub fn priority(mut self, priority: i32) -> NewSchedule {
        self.priority = priority;
        self
    }

    /// Read the expression in this IANA zone.
    pub fn tz(mut self, tz: impl Into<String>) -> NewSchedule {
        self.tz = tz.into();
        self
    }

    /// With this catch-up policy.
    pub fn catch_up(mut self, catch_up: CatchUp) -> NewSchedule {
        self.catch_up = catch_up;
        self
    }

    /// Check everything a worker will need, naming the field at fault.
    pub fn validate(&self) -> Result<CronSchedule, ScheduleError> {
        let name = &self.name;
        if name.trim().is_empty() {
            return Err(ScheduleError::invalid(Field::Name, "must not be empty"));
        }
        if name.len() > NAME_MAX || name.chars().any(char::is_control) {
            return Err(ScheduleError::invalid(
                Field::Name,
                format!("must be at most {NAME_MAX} bytes without control characters"),
            ));
        }
        if self.task.trim().is_empty() || self.task.len() > 256 {
            return Err(ScheduleError::invalid(
                Field::Task,
                "must be 1-256 bytes (the handler's task name)",
            ));
        }
        if let Some(q) = &self.queue {
            crate::config::validate_queue_name(q)
                .map_err(|e| ScheduleError::invalid(Field::Queue, config_reason(e)))?;
        }
        if let CatchUp::Missed(n) = self.catch_up {
            if !(1..=CATCH_UP_MAX).contains(&n) {
                return Err(ScheduleError::invalid(
                    Field::CatchUp,
                    format!("{n} is outside 1-{CATCH_UP_MAX} (or use skip)"),
                ));
            }
        }
        let cron = CronSchedule::parse(&self.cron, &self.tz).map_err(|e| match e {
            CronError::UnknownZone(_) => ScheduleError::invalid(Field::Tz, e.to_string()),
            _ => ScheduleError::invalid(Field::Cron, e.to_string()),
        })?;
        cron.next_after(Utc::now())
            .map_err(|e| ScheduleError::invalid(Field::Cron, e.to_string()))?;
        Ok(cron)
    }
}

fn config_reason(e: Error) -> String {
    match e {
        Error::Config(m) => m,
        other => other.to_string(),
    }
}

/// Add `schedule`; fails with [`ScheduleError::Exists`] if the name is taken.
/// Its first tick is the first one after now (the database's clock).
pub async fn add<C: GenericClient>(
    client: &C,
    schedule: &NewSchedule,
) -> Result<(), ScheduleError> {
    put(client, schedule, false).await
}

/// Add `schedule`, or redefine the schedule of that name: its next tick is
/// computed afresh from now; its counters are kept.
pub async fn replace<C: GenericClient>(
    client: &C,
    schedule: &NewSchedule,
) -> Result<(), ScheduleError> {
    put(client, schedule, true).await
}

async fn put<C: GenericClient>(
    client: &C,
    s: &NewSchedule,
    replace: bool,
) -> Result<(), ScheduleError> {
    s.validate()?;
    let queue = s.queue.as_deref().unwrap_or("default");
    let catch_up = s.catch_up.to_string();
    let r = Db::unnamed(client.client())
        .execute(
            &sql::SCHEDULE_ADD,
            &[
                &s.name,
                &s.cron,
                &s.task,
                &s.payload,
                &queue,
                &s.priority,
                &s.tz,
                &catch_up,
                &replace,
            ],
        )
        .await;
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.code() == Some(&SqlState::UNIQUE_VIOLATION) => {
            Err(ScheduleError::Exists(s.name.clone()))
        }
        // What the SQL checks and this side did not (e.g. a zone the
        // server's tzdata lacks): "field: reason".
        Err(e) if e.code() == Some(&SqlState::INVALID_PARAMETER_VALUE) => {
            let message = e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_default();
            let field = Field::of_sql_message(&message);
            let reason = message
                .split_once(": ")
                .map(|(_, r)| r.to_string())
                .unwrap_or(message);
            Err(ScheduleError::invalid(field, reason))
        }
        Err(e) => Err(Error::Db {
            context: "schedule add failed",
            source: e,
        }
        .into()),
    }
}

/// Remove the schedule `name`; [`ScheduleError::NotFound`] if there is none.
/// Jobs it already enqueued stay in the queue.
pub async fn remove<C: GenericClient>(client: &C, name: &str) -> Result<(), ScheduleError> {
    let removed: bool = Db::unnamed(client.client())
        .query_one(&sql::SCHEDULE_REMOVE, &[&name])
        .await
        .map_err(Error::db("schedule remove failed"))?
        .get(0);
    if removed {
        Ok(())
    } else {
        Err(ScheduleError::NotFound(name.to_string()))
    }
}

/// Enqueue one job of the schedule `name` now, as its next tick would (its
/// task, payload, queue and priority), without touching its ticks or
/// counters; returns the job's id. [`ScheduleError::NotFound`] if there is
/// no such schedule.
pub async fn run_now<C: GenericClient>(client: &C, name: &str) -> Result<i64, ScheduleError> {
    let rows = Db::unnamed(client.client())
        .query(&sql::SCHEDULE_RUN_NOW, &[&name])
        .await
        .map_err(Error::db("schedule run now failed"))?;
    match rows.first() {
        Some(r) => Ok(r.get(0)),
        None => Err(ScheduleError::NotFound(name.to_string())),
    }
}

/// Enable or disable the schedule `name`; [`ScheduleError::NotFound`] if
/// there is none. A disabled schedule is not served: no tick is enqueued,
/// counted as missed or reported overdue. Enabling it again serves its first
/// tick after this moment (the ticks of the disabled time are not caught
/// up). Doing what is already so changes nothing.
pub async fn set_enabled<C: GenericClient>(
    client: &C,
    name: &str,
    enabled: bool,
) -> Result<(), ScheduleError> {
    let rows = Db::unnamed(client.client())
        .query(&sql::SCHEDULE_SET_ENABLED, &[&name, &enabled])
        .await
        .map_err(Error::db("schedule enable/disable failed"))?;
    if rows.is_empty() {
        return Err(ScheduleError::NotFound(name.to_string()));
    }
    Ok(())
}

/// A schedule as stored, with its counters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleInfo {
    /// Name.
    pub name: String,
    /// Cron expression.
    pub cron: String,
    /// Time zone.
    pub tz: String,
    /// Task of its jobs.
    pub task: String,
    /// Payload of its jobs.
    pub payload: serde_json::Value,
    /// Queue of its jobs.
    pub queue: String,
    /// Priority of its jobs.
    pub priority: i32,
    /// Catch-up policy.
    pub catch_up: CatchUp,
    /// The next tick to serve; `None` until a worker has computed it (just
    /// added or redefined) or while the schedule is invalid.
    pub next_tick: Option<DateTime<Utc>>,
    /// The newest tick enqueued.
    pub last_tick: Option<DateTime<Utc>>,
    /// The job of the newest tick.
    pub last_job_id: Option<i64>,
    /// Ticks enqueued since it was added.
    pub ticks_enqueued: i64,
    /// Ticks dropped by the catch-up policy.
    pub ticks_missed: i64,
    /// Ticks skipped because the previous job was still waiting.
    pub ticks_waiting: i64,
    /// Why workers cannot serve it, if they cannot.
    pub error: Option<String>,
    /// Whether workers serve it ([`set_enabled`]).
    pub enabled: bool,
}

/// Every schedule, by name.
pub async fn list<C: GenericClient>(client: &C) -> Result<Vec<ScheduleInfo>, ScheduleError> {
    read(client, &sql::SCHEDULE_LIST, &[]).await
}

/// Schedules by name, at most `limit` from the `offset`-th: one page of the
/// console's Schedules page. Reads the rows up to the page, not every
/// schedule.
pub async fn page<C: GenericClient>(
    client: &C,
    offset: i64,
    limit: i64,
) -> Result<Vec<ScheduleInfo>, ScheduleError> {
    read(client, &sql::SCHEDULE_PAGE, &[&limit, &offset]).await
}

async fn read<C: GenericClient>(
    client: &C,
    statement: &sql::Sql,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<ScheduleInfo>, ScheduleError> {
    let rows = Db::unnamed(client.client())
        .query(statement, params)
        .await
        .map_err(Error::db("schedule list failed"))?;
    Ok(rows
        .iter()
        .map(|r| ScheduleInfo {
            name: r.get("name"),
            cron: r.get("cron"),
            tz: r.get("tz"),
            task: r.get("task"),
            payload: r.get("payload"),
            queue: r.get("queue"),
            priority: r.get("priority"),
            catch_up: r
                .get::<_, String>("catch_up")
                .parse()
                .unwrap_or(CatchUp::Skip),
            next_tick: r.get("next_tick"),
            last_tick: r.get("last_tick"),
            last_job_id: r.get("last_job_id"),
            ticks_enqueued: r.get("ticks_enqueued"),
            ticks_missed: r.get("ticks_missed"),
            ticks_waiting: r.get("ticks_waiting"),
            error: r.get("error"),
            enabled: r.get("enabled"),
        })
        .collect())
}
