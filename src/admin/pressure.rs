//! The governor's reading: how much pressure the database is under
//! (`pgwake.pressure()`, `functions/pressure.sql`), as a [`Level`] with its
//! [`Cause`]s, and the log of its changes.
//!
//! ```text
//!            any measure ≥ its elevated threshold
//!     ok ─────────────────────────────────────────▶ elevated
//!      ▲  every measure < elevated × leave_ratio        │ any measure ≥ critical
//!      └────────────────────────────────────────────────┤ (also straight from ok)
//!                                                       ▼
//!                every measure < critical × leave_ratio   critical
//!     elevated / ok ◀───────────────────────────────────  (shed queues paused;
//!                                                          resumed on leaving)
//! ```
//!
//! The state lives in the database (`pgwake.pressure_state`), not in a
//! worker: every worker's sampler and every `psql` session reads the same
//! level, a restarted worker does not forget that its queues were shed, and
//! the one call that changes the level ([`Pressure::changed`]) is the one
//! that records it, sheds or resumes, and logs it.

use serde::Serialize;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// How much pressure the database is under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// Every measure below its elevated threshold (or, leaving, below it ×
    /// the leave ratio).
    Ok,
    /// A measure at or above its elevated threshold: look at the causes.
    Elevated,
    /// A measure at or above its critical threshold: queues marked
    /// `shed_under_pressure` are paused until the level falls.
    Critical,
}

impl Level {
    /// `ok`, `elevated` or `critical`, as the database writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Elevated => "elevated",
            Level::Critical => "critical",
        }
    }

    /// 0, 1 or 2: the value of the `pgwake_pressure_level` gauge.
    pub fn gauge(self) -> f64 {
        match self {
            Level::Ok => 0.0,
            Level::Elevated => 1.0,
            Level::Critical => 2.0,
        }
    }

    /// Parse the database's word; anything else is a schema mismatch.
    pub fn parse(s: &str) -> Result<Level> {
        match s {
            "ok" => Ok(Level::Ok),
            "elevated" => Ok(Level::Elevated),
            "critical" => Ok(Level::Critical),
            other => Err(Error::Schema(format!(
                "pgwake.pressure() returned an unknown level {other:?}"
            ))),
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One cause of the level, or something worth knowing beside it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Cause {
    /// `horizon`, `dead_tuples`, `notify_queue` (these drive the level);
    /// `replication_slot`, `autovacuum`, `replication`, `visibility`
    /// (informational).
    pub kind: String,
    /// The level this measure holds on its own (`elevated`, `critical`), or
    /// `info` for the informational kinds.
    pub level: String,
    /// One line for people: "horizon held 3 min by pid 4711 (metabase),
    /// idle in transaction".
    pub detail: String,
    /// Every field of the cause as the database wrote it (the measure, its
    /// thresholds, the holder's pid, application_name, …).
    pub fields: serde_json::Value,
}

impl Cause {
    fn from_json(v: &serde_json::Value) -> Cause {
        let text = |k: &str| v.get(k).and_then(|x| x.as_str()).unwrap_or("").to_string();
        Cause {
            kind: text("kind"),
            level: text("level"),
            detail: text("detail"),
            fields: v.clone(),
        }
    }
}

/// Parse a jsonb array of causes.
pub fn causes_from_json(v: &serde_json::Value) -> Vec<Cause> {
    v.as_array()
        .map(|a| a.iter().map(Cause::from_json).collect())
        .unwrap_or_default()
}

/// One reading of `pgwake.pressure()`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Pressure {
    /// The level, hysteresis applied.
    pub level: Level,
    /// When it was entered.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Whether this call changed the level (true for exactly one caller per
    /// change: that caller's call recorded it, logged it and shed or
    /// resumed queues).
    pub changed: bool,
    /// The causes, driving ones first.
    pub causes: Vec<Cause>,
    /// The level before this call (the same as `level` unless the level
    /// changed: a change this call made, or, for a role that records
    /// nothing, the level its own reading would move to).
    pub previous: Level,
}

impl Pressure {
    /// Whether the level rose (from `previous`).
    pub fn rose(&self) -> bool {
        self.level > self.previous
    }
}

/// Call `pgwake.pressure()`: measure, apply hysteresis, and record a change
/// (when the role may: see `functions/pressure.sql`). Not inside a
/// read-only transaction: a change writes.
pub async fn read(client: &tokio_postgres::Client) -> Result<Pressure> {
    let row = Db::unnamed(client)
        .query_one(&sql::PRESSURE, &[])
        .await
        .map_err(Error::db("reading the database pressure"))?;
    let causes: serde_json::Value = row.get(3);
    Ok(Pressure {
        level: Level::parse(row.get(0))?,
        since: row.get(1),
        changed: row.get(2),
        causes: causes_from_json(&causes),
        previous: Level::parse(row.get(4))?,
    })
}

/// The level as last recorded (`pgwake.pressure_state`): the level, when
/// it was entered, and the causes at that change. Read-only, for readers
/// (the console) that must not record anything; the level is as fresh as
/// the last sampler's call of `pgwake.pressure()`.
pub async fn recorded(
    client: &tokio_postgres::Client,
) -> Result<(Level, chrono::DateTime<chrono::Utc>, Vec<Cause>)> {
    let row = Db::unnamed(client)
        .query_one(&sql::PRESSURE_STATE, &[])
        .await
        .map_err(Error::db("reading the recorded database pressure"))?;
    let causes: serde_json::Value = row.get(2);
    Ok((
        Level::parse(row.get(0))?,
        row.get(1),
        causes_from_json(&causes),
    ))
}

/// One change of level, from `pgwake.pressure_log`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[non_exhaustive]
pub struct Change {
    /// When.
    pub at: chrono::DateTime<chrono::Utc>,
    /// The level entered.
    pub level: Level,
    /// The level left.
    pub previous: Level,
    /// The causes at the change.
    pub causes: Vec<Cause>,
    /// Queues the change paused (entering critical).
    pub paused: Vec<String>,
    /// Queues the change resumed (leaving critical).
    pub resumed: Vec<String>,
}

/// The changes of the last `window`, newest first, at most `limit`.
pub async fn log(
    client: &tokio_postgres::Client,
    window: std::time::Duration,
    limit: i64,
) -> Result<Vec<Change>> {
    let rows = Db::unnamed(client)
        .query(&sql::PRESSURE_LOG, &[&window.as_secs_f64(), &limit])
        .await
        .map_err(Error::db("reading the pressure log"))?;
    let names = |v: &serde_json::Value, k: &str| -> Vec<String> {
        v.get(k)
            .and_then(|a| a.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    rows.iter()
        .map(|r| {
            let causes: serde_json::Value = r.get(3);
            let actions: serde_json::Value = r.get(4);
            Ok(Change {
                at: r.get(0),
                level: Level::parse(r.get(1))?,
                previous: Level::parse(r.get(2))?,
                causes: causes_from_json(&causes),
                paused: names(&actions, "paused"),
                resumed: names(&actions, "resumed"),
            })
        })
        .collect()
}

/// The thresholds of `pgwake.pressure()` (`pgwake.pressure_settings`): a
/// measure at or above its `elevated` (`critical`) threshold raises the
/// level to elevated (critical); a level is left only when every measure
/// falls below its threshold × `leave_ratio`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Thresholds {
    /// Seconds the horizon is held (the oldest transaction of the database).
    pub horizon_elevated_seconds: Option<f64>,
    /// Seconds the horizon is held, critical.
    pub horizon_critical_seconds: Option<f64>,
    /// Dead tuples of the queue tables, summed.
    pub dead_tuples_elevated: Option<i64>,
    /// Dead tuples, critical.
    pub dead_tuples_critical: Option<i64>,
    /// Fraction of the NOTIFY queue in use.
    pub notify_elevated: Option<f64>,
    /// NOTIFY queue, critical.
    pub notify_critical: Option<f64>,
    /// A level is left below threshold × this ratio, in (0, 1).
    pub leave_ratio: Option<f64>,
}

impl Thresholds {
    fn from_json(v: serde_json::Value) -> Result<Thresholds> {
        serde_json::from_value(v)
            .map_err(|e| Error::Schema(format!("pgwake.pressure_settings unreadable: {e}")))
    }
}

/// The thresholds as set (every field `Some`).
pub async fn thresholds(client: &tokio_postgres::Client) -> Result<Thresholds> {
    let row = Db::unnamed(client)
        .query_one(&sql::PRESSURE_THRESHOLDS, &[])
        .await
        .map_err(Error::db("reading the pressure thresholds"))?;
    Thresholds::from_json(row.get(0))
}

/// Change the thresholds given (`None`: keep) in one statement; returns
/// every threshold as now set. A set that makes no sense (elevated not
/// below critical, a fraction over 1, a horizon over 7 days) is refused
/// with [`Error::Config`] naming the range, and nothing changes.
pub async fn set_thresholds(client: &tokio_postgres::Client, t: &Thresholds) -> Result<Thresholds> {
    let r = Db::unnamed(client)
        .query_one(
            &sql::PRESSURE_SET_THRESHOLDS,
            &[
                &t.horizon_elevated_seconds,
                &t.horizon_critical_seconds,
                &t.dead_tuples_elevated,
                &t.dead_tuples_critical,
                &t.notify_elevated,
                &t.notify_critical,
                &t.leave_ratio,
            ],
        )
        .await;
    match r {
        Ok(row) => Thresholds::from_json(row.get(0)),
        Err(e) => match e.as_db_error() {
            Some(d) if *d.code() == tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE => {
                Err(Error::Config(
                    d.message()
                        .trim_start_matches("pgwake.set_pressure_thresholds: ")
                        .to_string(),
                ))
            }
            _ => Err(Error::db("setting the pressure thresholds")(e)),
        },
    }
}
