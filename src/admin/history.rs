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
//! setting within [`MAINTENANCE_INTERVAL_DEFAULT`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::GenericClient;
use tokio_util::sync::CancellationToken;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::job::Outcome;
use crate::metrics;

/// How often each worker reads the history setting and (one worker at a
/// time) maintains the partitions.
pub const MAINTENANCE_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);
/// Daily partitions created ahead of today (UTC).
pub const PARTITIONS_AHEAD_DEFAULT: i32 = 2;
/// How long a partition's CREATE or DROP waits for its lock before giving
/// up until the next round (history writes queue behind it meanwhile;
/// producers and claims never touch the history table).
pub const MAINTENANCE_LOCK_TIMEOUT_DEFAULT: Duration = Duration::from_millis(100);
/// Shortest `--keep-finished`: partitions are daily, so a shorter setting
/// would keep rows up to a day anyway.
pub const KEEP_FINISHED_MIN: Duration = Duration::from_secs(3600);

/// What a worker does to the database's history setting at start-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KeepFinished {
    /// Leave it as it is and follow it (the default: history stays off
    /// unless someone turned it on).
    #[default]
    Unchanged,
    /// Turn history off for the database (`--keep-finished off`).
    Off,
    /// Turn it on, keeping finished jobs at least this long (and at most a
    /// day longer: partitions are dropped whole).
    Keep(Duration),
}

impl KeepFinished {
    /// Parse `off` or a duration (`7d`, `36h`).
    pub fn parse(s: &str) -> std::result::Result<KeepFinished, String> {
        if s == "off" {
            return Ok(KeepFinished::Off);
        }
        let d = humantime::parse_duration(s)
            .map_err(|e| format!("{e}; expected a duration such as 7d or 36h, or `off`"))?;
        Ok(KeepFinished::Keep(d))
    }
}

/// History settings of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryConfig {
    /// Set the database's history setting at start-up. Default
    /// [`KeepFinished::Unchanged`].
    pub keep_finished: KeepFinished,
    /// How often the setting is re-read and partitions maintained. Default
    /// 60 s ([`MAINTENANCE_INTERVAL_DEFAULT`]).
    pub maintenance_interval: Duration,
    /// Daily partitions created ahead. Default 2
    /// ([`PARTITIONS_AHEAD_DEFAULT`]).
    pub partitions_ahead: i32,
    /// Lock wait of one partition CREATE/DROP. Default 100 ms
    /// ([`MAINTENANCE_LOCK_TIMEOUT_DEFAULT`]).
    pub lock_timeout: Duration,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            keep_finished: KeepFinished::Unchanged,
            maintenance_interval: MAINTENANCE_INTERVAL_DEFAULT,
            partitions_ahead: PARTITIONS_AHEAD_DEFAULT,
            lock_timeout: MAINTENANCE_LOCK_TIMEOUT_DEFAULT,
        }
    }
}

impl HistoryConfig {
    /// Check the settings; the error names the flag.
    pub fn validate(&self) -> Result<()> {
        if let KeepFinished::Keep(d) = self.keep_finished {
            if d < KEEP_FINISHED_MIN {
                return Err(Error::Config(format!(
                    "--keep-finished {}: at least 1h (history is partitioned by day and dropped a day at a time); use `off` to turn history off",
                    humantime::format_duration(d)
                )));
            }
            if d > Duration::from_secs(100 * 365 * 24 * 3600) {
                return Err(Error::Config("--keep-finished: at most 100 years".into()));
            }
        }
        if self.maintenance_interval.is_zero() {
            return Err(Error::Config(
                "history maintenance interval must be positive".into(),
            ));
        }
        if !(0..=366).contains(&self.partitions_ahead) {
            return Err(Error::Config(
                "history partitions ahead: 0 to 366 days".into(),
            ));
        }
        Ok(())
    }
}

/// Whether this worker records history right now (the database's setting
/// as last read). Off costs the claim path one relaxed atomic load.
#[derive(Debug, Default)]
pub(crate) struct Switch(AtomicBool);

impl Switch {
    pub(crate) fn on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub(crate) fn set(&self, on: bool) {
        let was = self.0.swap(on, Ordering::Relaxed);
        if was != on {
            tracing::info!(
                history = on,
                "history of finished jobs turned {}",
                if on { "on" } else { "off" }
            );
        }
    }
}

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

/// What one maintenance round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// The setting read (`None`: history off, nothing else was done).
    pub keep: Option<Duration>,
    /// Whether this worker maintained the partitions (false: history off,
    /// or another worker held the maintenance lock).
    pub maintained: bool,
    /// Partitions created.
    pub created: i32,
    /// Expired partitions dropped.
    pub dropped: i32,
    /// Rows they held (from the planner's statistics), plus rows deleted
    /// from the default partition.
    pub rows_dropped: i64,
    /// DDL that failed (e.g. a lock not obtained within the lock timeout);
    /// tried again next round.
    pub failed: Vec<String>,
}

/// The history maintenance service, run by every worker; one at a time
/// maintains (advisory lock).
pub struct Maintenance {
    pool: deadpool_postgres::Pool,
    config: HistoryConfig,
    switch: Arc<Switch>,
}

impl Maintenance {
    /// A maintenance service on `pool`.
    pub fn new(pool: deadpool_postgres::Pool, config: HistoryConfig) -> Maintenance {
        Maintenance {
            pool,
            config,
            switch: Arc::default(),
        }
    }

    pub(crate) fn with_switch(mut self, switch: Arc<Switch>) -> Maintenance {
        self.switch = switch;
        self
    }

    /// Maintain every `maintenance_interval` (jittered) until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        // Exported from the start (at 0), so dashboards and alerts see the
        // series before the first partition is ever dropped.
        for name in [
            metrics::HISTORY_PARTITIONS_DROPPED,
            metrics::HISTORY_ROWS_DROPPED,
            metrics::HISTORY_MAINTENANCE_FAILURES,
        ] {
            ::metrics::counter!(name).increment(0);
        }
        // The first round at once: a database where history was just turned
        // on has no daily partition yet.
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(crate::services::poller::jitter(self.config.maintenance_interval)) => {}
                }
            }
            first = false;
            match self.run_once().await {
                Ok(r) if !r.failed.is_empty() => {
                    tracing::warn!(failed = ?r.failed, "history maintenance: some partitions could not be created or dropped; trying again next round")
                }
                Ok(r) if r.created + r.dropped > 0 => {
                    tracing::info!(
                        created = r.created,
                        dropped = r.dropped,
                        rows = r.rows_dropped,
                        "history partitions maintained"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "history maintenance failed"),
            }
        }
    }

    /// One round: read the setting; if on and no other worker is at it,
    /// create partitions ahead and drop expired ones.
    pub async fn run_once(&self) -> Result<MaintenanceReport> {
        // A transaction object: any error rolls back (on drop) before the
        // connection goes back to the pool.
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(Error::pool("history maintenance: no connection"))?;
        let tx = conn
            .transaction()
            .await
            .map_err(Error::db("history maintenance: begin"))?;
        let row = Db::unnamed(tx.client())
            .query_one(&sql::HISTORY_LOCK, &[])
            .await
            .map_err(Error::db("history maintenance"))?;
        let keep = row.get::<_, Option<f64>>(0);
        let locked: bool = row.get(1);
        self.switch.set(keep.is_some());
        let mut report = MaintenanceReport {
            keep: keep.map(Duration::from_secs_f64),
            ..MaintenanceReport::default()
        };
        if let (Some(keep), true) = (keep, locked) {
            let lock_ms = self.config.lock_timeout.as_secs_f64() * 1000.0;
            let row = Db::unnamed(tx.client())
                .query_one(
                    &sql::HISTORY_MAINTAIN,
                    &[&keep, &self.config.partitions_ahead, &lock_ms],
                )
                .await
                .map_err(Error::db("history maintenance"))?;
            report.maintained = true;
            report.created = row.get(0);
            report.dropped = row.get(1);
            report.rows_dropped = row.get(2);
            report.failed = row.get(3);
        }
        tx.commit()
            .await
            .map_err(Error::db("history maintenance: commit"))?;
        if report.dropped > 0 {
            ::metrics::counter!(metrics::HISTORY_PARTITIONS_DROPPED)
                .increment(report.dropped as u64);
        }
        if report.rows_dropped > 0 {
            ::metrics::counter!(metrics::HISTORY_ROWS_DROPPED)
                .increment(report.rows_dropped as u64);
        }
        if !report.failed.is_empty() {
            ::metrics::counter!(metrics::HISTORY_MAINTENANCE_FAILURES)
                .increment(report.failed.len() as u64);
        }
        Ok(report)
    }
}

/// The result a handler's outcome carries, as JSON text the database always
/// accepts (`None` when there is none).
pub(crate) fn result_of(outcome: &Outcome) -> Option<String> {
    match outcome {
        Outcome::DoneWith(value) if !value.is_null() => {
            let mut value = value.clone();
            scrub(&mut value);
            serde_json::to_string(&value).ok()
        }
        _ => None,
    }
}

/// PostgreSQL's `jsonb` cannot hold U+0000: replace it in strings and keys
/// (a result must never make the outcome write fail).
fn scrub(value: &mut serde_json::Value) {
    use serde_json::Value;
    let clean = |s: &str| s.replace('\0', "\u{FFFD}");
    match value {
        Value::String(s) if s.contains('\0') => *s = clean(s),
        Value::Array(items) => items.iter_mut().for_each(scrub),
        Value::Object(map) => {
            if map.keys().any(|k| k.contains('\0')) {
                let old = std::mem::take(map);
                for (k, v) in old {
                    map.insert(clean(&k), v);
                }
            }
            map.values_mut().for_each(scrub);
        }
        _ => {}
    }
}

/// Count rows this worker recorded (the `pgwake_history_rows_total` metric).
pub(crate) fn count_recorded(outcome: &'static str, n: u64) {
    if n > 0 {
        ::metrics::counter!(metrics::HISTORY_ROWS, "outcome" => outcome).increment(n);
    }
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
}

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Finished jobs, newest first.
pub async fn list<C: GenericClient>(db: &C, filter: &Filter) -> Result<Vec<FinishedJob>> {
    if let Some(o) = &filter.outcome {
        if !OUTCOMES.contains(&o.as_str()) {
            return Err(Error::Config(format!(
                "--outcome {o:?}: expected done, dead or cancelled"
            )));
        }
    }
    let since = filter.since.map(|d| d.as_secs_f64());
    let rows = Db::unnamed(db.client())
        .query(
            &sql::HISTORY_LIST,
            &[
                &filter.queue,
                &filter.task,
                &filter.outcome,
                &filter.limit,
                &since,
                &filter.since_time,
            ],
        )
        .await
        .map_err(Error::db("cannot list finished jobs"))?;
    Ok(rows
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
        })
        .collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_lose_nul_and_keep_numbers() {
        let v = serde_json::json!({"a\u{0}": ["x\u{0}y", 1]});
        let text = result_of(&Outcome::DoneWith(v)).unwrap();
        assert!(!text.contains("\\u0000"), "{text}");
        let big: serde_json::Value = serde_json::from_str("12345678901234567890123").unwrap();
        assert_eq!(
            result_of(&Outcome::DoneWith(big)).unwrap(),
            "12345678901234567890123"
        );
        assert_eq!(result_of(&Outcome::Done), None);
        assert_eq!(result_of(&Outcome::DoneWith(serde_json::Value::Null)), None);
    }

    #[test]
    fn keep_finished_parses_off_and_durations() {
        assert_eq!(KeepFinished::parse("off"), Ok(KeepFinished::Off));
        assert_eq!(
            KeepFinished::parse("7d"),
            Ok(KeepFinished::Keep(Duration::from_secs(7 * 86400)))
        );
        assert!(KeepFinished::parse("soon").is_err());
        let short = HistoryConfig {
            keep_finished: KeepFinished::Keep(Duration::from_secs(60)),
            ..HistoryConfig::default()
        };
        assert!(short.validate().is_err());
    }
}
