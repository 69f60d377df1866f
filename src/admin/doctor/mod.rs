//! `pgwake doctor`: what breaks PostgreSQL queues in production, checked
//! against a live database, each finding with its fix.
//!
//! ```text
//!   examine(pool, thresholds)
//!     ├─ pooler.mode                     two pooled connections, one server process?
//!     ├─ schema.version                  pending migrations, a schema newer than this pgwake
//!     ├─ stats.visibility                can this role see other roles' sessions?
//!     ├─ horizon.pinned                  sessions holding the vacuum horizon  ─┐
//!     ├─ horizon.replication_slot        slots holding xmin / WAL              ├ horizon.rs
//!     ├─ horizon.prepared_transaction    forgotten two-phase commits          ─┘
//!     ├─ timeouts.idle_in_transaction    the database's idle-in-transaction limit ─┐
//!     ├─ timeouts.statement              pgwake roles' statement_timeout            ├ settings.rs
//!     ├─ timeouts.idle_session           pgwake roles' idle_session_timeout         │
//!     ├─ connections.budget              sessions against max_connections           │
//!     ├─ notify.queue                    pg_notification_queue_usage()             ─┘
//!     ├─ autovacuum.off                  server or per table                       ─┐
//!     ├─ tables.dead_tuples              per pgwake table, with autovacuum's state  ├ tables.rs
//!     ├─ tables.index_bloat              index size against live rows             ─┘
//!     ├─ workers.versions                live workers of another pgwake version   ─┐ fleet.rs
//!     └─ tasks.unserved                  jobs no live worker can run              ─┘
//! ```
//!
//! Every check is one finding with a stable id ([`CHECKS`]), whatever it
//! finds: `ok` findings say what was seen, so a monitor can read every id
//! on every run. A check that cannot run (a permission, an old schema) is a
//! `warning` saying so, never an error of the whole examination: a role
//! without `pg_read_all_stats` gets what it can see and a finding naming
//! what it cannot. Every read is bounded (statistics views, catalogs,
//! estimates, `LIMIT`ed lists; never a `count(*)` of the queue) and takes no
//! lock. Values that come from the database or from producers (application
//! names, statements, task names) are returned as they are: whoever prints
//! them escapes them (the command line does).

mod fleet;
mod horizon;
mod settings;
mod tables;

use std::time::Duration;

use serde::Serialize;

use crate::error::{Error, Result};

/// Every finding's id, in the order [`examine`] reports them.
pub const CHECKS: &[&str] = &[
    fleet::POOLER,
    fleet::SCHEMA,
    settings::VISIBILITY,
    horizon::PINNED,
    horizon::SLOTS,
    horizon::PREPARED,
    settings::IDLE_IN_TRANSACTION,
    settings::STATEMENT,
    settings::IDLE_SESSION,
    settings::CONNECTIONS,
    settings::NOTIFY,
    tables::AUTOVACUUM,
    tables::DEAD_TUPLES,
    tables::INDEX_BLOAT,
    fleet::VERSIONS,
    fleet::UNSERVED,
];

/// How bad a finding is. Ordered: the report's severity is its worst
/// finding's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Nothing to do.
    Ok,
    /// Worth a look: it will hurt if it lasts or grows.
    Warning,
    /// Hurts the queue (or its database) now, or cannot be checked safely.
    Problem,
}

impl Severity {
    /// `ok`, `warning` or `problem`.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warning => "warning",
            Severity::Problem => "problem",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Finding {
    /// The check's stable id ([`CHECKS`]), e.g. `horizon.pinned`.
    pub id: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// One line: what was found.
    pub summary: String,
    /// What supports it, one item a line (sessions, tables, settings);
    /// bounded lists.
    pub details: Vec<String>,
    /// What to do, one statement or step a line (empty when `ok`).
    pub fix: Vec<String>,
}

impl Finding {
    fn new(id: &'static str, severity: Severity, summary: impl Into<String>) -> Finding {
        Finding {
            id,
            severity,
            summary: summary.into(),
            details: Vec::new(),
            fix: Vec::new(),
        }
    }

    fn ok(id: &'static str, summary: impl Into<String>) -> Finding {
        Finding::new(id, Severity::Ok, summary)
    }

    fn details(mut self, details: Vec<String>) -> Finding {
        self.details = details;
        self
    }

    fn fix(mut self, fix: Vec<String>) -> Finding {
        self.fix = fix;
        self
    }

    /// A check that could not run: a warning naming why (a permission, an
    /// older schema), so that the report still says what it did not see.
    fn unchecked(id: &'static str, error: &Error) -> Finding {
        Finding::new(id, Severity::Warning, format!("could not check: {error}"))
    }
}

/// Every finding of one examination.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// This pgwake's version (the one `workers.versions` compares with).
    pub pgwake_version: &'static str,
    /// The database examined.
    pub database: String,
    /// The role the checks ran as.
    pub role: String,
    /// The worst severity of the findings.
    pub severity: Severity,
    /// One finding per check, in [`CHECKS`] order.
    pub findings: Vec<Finding>,
}

/// How long a session may hold the vacuum horizon before it is a warning,
/// by default: a queue that claims and deletes hundreds of jobs a second
/// piles up that many dead rows a minute.
pub const HORIZON_WARNING_DEFAULT: Duration = Duration::from_secs(60);
/// … and a problem (issue 35 measured producers collapsing within 20 s of
/// a pin at 1,500 jobs/s).
pub const HORIZON_PROBLEM_DEFAULT: Duration = Duration::from_secs(600);
/// Dead tuples in one pgwake table that make a warning, by default; ten
/// times as many make a problem. `pgwake.jobs` asks autovacuum to run at
/// 10,000 (migration 0001): ten times that means vacuum cannot keep up or
/// cannot remove them.
pub const DEAD_TUPLES_WARNING_DEFAULT: i64 = 100_000;
/// Smallest index, in bytes, that the bloat check reports, by default.
pub const INDEX_BLOAT_MIN_BYTES_DEFAULT: i64 = 64 * 1024 * 1024;
/// An index this many times larger than its live rows need is bloated.
pub const INDEX_BLOAT_RATIO: f64 = 4.0;
/// Bytes one live row needs in an index, as the bloat estimate counts it
/// (a generous B-tree entry of pgwake's keys, fill factor included).
pub const INDEX_BYTES_PER_ROW: f64 = 72.0;
/// Share of the connection limit in use that makes a warning.
pub const CONNECTIONS_WARNING: f64 = 0.8;
/// … and a problem.
pub const CONNECTIONS_PROBLEM: f64 = 0.95;
/// Share of the NOTIFY queue (8 GB) in use that makes a warning: about
/// 80 MB of notifications nobody read, which a healthy server never holds.
pub const NOTIFY_WARNING: f64 = 0.01;
/// … and a problem (the `PgwakeNotifyQueueOverHalfFull` alert's level):
/// at 100% every NOTIFY, and so every insert into `pgwake.jobs`, fails.
pub const NOTIFY_PROBLEM: f64 = 0.5;
/// A pgwake role's `statement_timeout` shorter than this is a warning:
/// migrations' index builds, rescues and history maintenance run under it.
pub const STATEMENT_TIMEOUT_MIN: Duration = Duration::from_secs(60);
/// Most sessions, slots or prepared transactions one check lists.
pub const LIST_MAX: i64 = 20;

/// The levels the checks compare with. Defaults: the `*_DEFAULT`
/// constants.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Thresholds {
    /// A session or prepared transaction holding the horizon this long is a
    /// warning ([`HORIZON_WARNING_DEFAULT`]).
    pub horizon_warning: Duration,
    /// … this long a problem ([`HORIZON_PROBLEM_DEFAULT`]).
    pub horizon_problem: Duration,
    /// Dead tuples of one table that make a warning; ten times as many a
    /// problem ([`DEAD_TUPLES_WARNING_DEFAULT`]).
    pub dead_tuples_warning: i64,
    /// Indexes smaller than this (bytes) are never reported bloated
    /// ([`INDEX_BLOAT_MIN_BYTES_DEFAULT`]).
    pub index_bloat_min_bytes: i64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            horizon_warning: HORIZON_WARNING_DEFAULT,
            horizon_problem: HORIZON_PROBLEM_DEFAULT,
            dead_tuples_warning: DEAD_TUPLES_WARNING_DEFAULT,
            index_bloat_min_bytes: INDEX_BLOAT_MIN_BYTES_DEFAULT,
        }
    }
}

impl Thresholds {
    /// Refuse levels that cannot be meant, naming the setting and its
    /// range ([`Error::Config`]).
    pub fn validate(&self) -> Result<()> {
        if self.horizon_problem < self.horizon_warning {
            return Err(Error::Config(format!(
                "--horizon-problem ({}) must be at least --horizon-warning ({})",
                humantime::format_duration(self.horizon_problem),
                humantime::format_duration(self.horizon_warning)
            )));
        }
        if self.dead_tuples_warning < 1 {
            return Err(Error::Config(format!(
                "--dead-tuples-warning must be 1 or more (got {})",
                self.dead_tuples_warning
            )));
        }
        if self.index_bloat_min_bytes < 0 {
            return Err(Error::Config(format!(
                "--index-bloat-min-size must be 0 or more (got {})",
                self.index_bloat_min_bytes
            )));
        }
        Ok(())
    }

    fn horizon_severity(&self, age_seconds: f64) -> Severity {
        if age_seconds >= self.horizon_problem.as_secs_f64() {
            Severity::Problem
        } else if age_seconds >= self.horizon_warning.as_secs_f64() {
            Severity::Warning
        } else {
            Severity::Ok
        }
    }
}

/// What the checks share: the connection, the thresholds, and what the
/// first reads learnt.
struct Ctx<'a> {
    client: &'a tokio_postgres::Client,
    thresholds: &'a Thresholds,
    /// Whether the pgwake schema is there (at any version).
    schema: bool,
    /// The database, for the fixes' `ALTER DATABASE`.
    database: String,
    /// The role the checks run as.
    role: String,
}

/// Run every check on `pool`'s database (two connections at most) and
/// report each finding. `Err` only when no connection can be had or the
/// thresholds are refused; a check that fails is a finding.
pub async fn examine(pool: &deadpool_postgres::Pool, thresholds: &Thresholds) -> Result<Report> {
    thresholds.validate()?;
    // First, while no connection is held: the pooler check needs two.
    let pooler = fleet::pooler(pool).await;
    let conn = pool
        .get()
        .await
        .map_err(Error::pool("doctor: no connection"))?;
    let server = settings::Server::read(&conn).await;
    let (database, role) = match &server {
        Ok(s) => (s.database.clone(), s.role.clone()),
        Err(_) => (String::new(), String::new()),
    };
    let version = crate::admin::schema::current_version(&conn).await;
    let mut ctx = Ctx {
        client: &conn,
        thresholds,
        schema: matches!(version, Ok(Some(_))),
        database,
        role,
    };
    let mut findings = vec![pooler, fleet::schema(&version)];
    match &server {
        Ok(server) => {
            findings.push(settings::visibility(server));
            findings.extend(horizon::check(&ctx).await);
            findings.extend(settings::timeouts(&ctx).await);
            findings.push(settings::connections(&ctx, server).await);
            findings.push(settings::notify(&ctx, server).await);
            findings.extend(tables::check(&ctx, server).await);
        }
        Err(e) => {
            for id in CHECKS
                .iter()
                .filter(|id| ![fleet::POOLER, fleet::SCHEMA].contains(id))
                .take_while(|id| **id != fleet::VERSIONS)
            {
                findings.push(Finding::unchecked(id, e));
            }
            ctx.schema = false;
        }
    }
    findings.extend(fleet::workers(&ctx).await);
    let severity = findings
        .iter()
        .map(|f| f.severity)
        .max()
        .unwrap_or(Severity::Ok);
    Ok(Report {
        pgwake_version: env!("CARGO_PKG_VERSION"),
        database: ctx.database,
        role: ctx.role,
        severity,
        findings,
    })
}

/// `seconds` for a person: `45 s`, `12 min`, `3 h 5 min`, `2 d 4 h`.
pub fn age(seconds: f64) -> String {
    let s = seconds.max(0.0).round() as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        7200..=172_799 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

/// `bytes` for a person: `512 B`, `3.2 MiB`, `1.5 GiB`.
pub fn size(bytes: i64) -> String {
    let b = bytes.max(0) as f64;
    if b < 1024.0 {
        format!("{b} B")
    } else if b < 1024.0 * 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else if b < 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else {
        format!("{:.1} GiB", b / 1024.0 / 1024.0 / 1024.0)
    }
}

/// `name` as an SQL identifier, always double-quoted (a role may be called
/// `user`, a keyword).
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an SQL string literal.
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_and_literals_are_quoted_for_sql() {
        assert_eq!(ident("user"), "\"user\"");
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(literal("it's"), "'it''s'");
    }

    #[test]
    fn thresholds_that_cannot_be_meant_are_refused() {
        let t = Thresholds {
            horizon_warning: Duration::from_secs(600),
            horizon_problem: Duration::from_secs(60),
            ..Thresholds::default()
        };
        assert!(t.validate().unwrap_err().is_usage());
        assert!(Thresholds::default().validate().is_ok());
    }

    #[test]
    fn ages_read_like_a_person_would_say_them() {
        assert_eq!(age(45.2), "45 s");
        assert_eq!(age(720.0), "12 min");
        assert_eq!(age(3.0 * 3600.0 + 300.0), "3 h 5 min");
        assert_eq!(age(2.0 * 86_400.0 + 4.0 * 3600.0), "2 d 4 h");
    }
}
