//! Queue settings (migrations 0009, 0010): `pgwake queue list | pause |
//! resume | set` and the same through SQL (`pgwake.pause_queue`,
//! `pgwake.resume_queue`, `pgwake.set_queue_max_running`,
//! `pgwake.set_queue_rate`, functions/queues.sql).
//!
//! ```text
//!  pgwake queue pause Q ──▶ pgwake.pause_queue(Q): row in pgwake.queues, paused
//!  every claim statement (src/db/sql/claim_*.sql) skips the queues paused there
//!      → no worker starts a job of Q; running jobs finish; survives restarts
//!  pgwake queue resume Q ──▶ pgwake.resume_queue(Q): paused = false, NOTIFY pgwake Q
//!      → idle workers wake and claim at once
//!  pgwake queue set Q --shed-under-pressure on ──▶ the governor
//!      (pgwake.pressure(), functions/pressure.sql) pauses Q at the change
//!      to critical (paused_by = 'pressure') and resumes it when the level
//!      falls below critical, unless an operator paused or resumed it since
//! ```
//!
//! Workers keep no copy of these settings: the claim reads the table, so a
//! change is seen by the next claim of every worker, with no restart and no
//! message that could be lost.

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::db::sql::{
    Db, Sql, QUEUE_LIST, QUEUE_PAUSE, QUEUE_RESUME, QUEUE_SET_FAIR_KEYS, QUEUE_SET_KEY_MAX_RUNNING,
    QUEUE_SET_LIMIT_KEY_PATH, QUEUE_SET_MAX_RUNNING, QUEUE_SET_MAX_RUNNING_PER_KEY, QUEUE_SET_RATE,
    QUEUE_SET_RATE_PER_KEY, QUEUE_SET_SHED,
};
use crate::error::{Error, Result};

/// One queue's settings, as `pgwake queue list` shows them.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueSettings {
    /// Queue name.
    pub queue: String,
    /// Whether claims skip this queue.
    pub paused: bool,
    /// When it was paused (`None` when running).
    pub paused_at: Option<chrono::DateTime<chrono::Utc>>,
    /// At most this many of its jobs run at once across every worker
    /// (`None`: no limit).
    pub max_running: Option<i32>,
    /// At most this many of its jobs are admitted in any window of the
    /// given length (`None`: no rate limit).
    pub rate: Option<RateLimit>,
    /// The payload field a job enqueued without a limit key takes its key
    /// from (`None`: none).
    pub limit_key_path: Option<String>,
    /// Whether claims take the queue's ready jobs in rotation between
    /// limit keys.
    pub fair_keys: bool,
    /// At most this many jobs of any one limit key run at once across
    /// every worker (`None`: no per-key limit).
    pub max_running_per_key: Option<i32>,
    /// Keys with a limit of their own, by key.
    pub key_max_running: std::collections::BTreeMap<String, i32>,
    /// At most this many jobs of any one limit key are admitted in any
    /// window of the given length (`None`: no per-key rate).
    pub rate_per_key: Option<RateLimit>,
    /// Whether the governor pauses the queue while the database pressure
    /// is critical (`pgwake queue set Q --shed-under-pressure on`).
    pub shed_under_pressure: bool,
    /// Who holds it paused: `Some("pressure")` when the governor shed it
    /// (it resumes when the pressure falls), `None` for an operator's pause
    /// or a running queue.
    pub paused_by: Option<String>,
}

/// A rate limit: at most `count` jobs admitted in any window of `per`
/// (sliding), across every worker. Written `N/s`, `N/min`, `N/h` or
/// `N/<duration>` (`20/s`, `600/min`, `1/50ms`); shown the same way.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Admissions per window.
    pub count: i32,
    /// The window.
    pub per: std::time::Duration,
}

/// Most admissions one window may have (one slot row each).
pub const RATE_COUNT_MAX: i32 = 100_000;

impl std::str::FromStr for RateLimit {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = |why: &str| {
            format!("invalid rate {s:?}: {why} (write N/s, N/min, N/h or N/<duration>, e.g. 20/s, 600/min, 1/50ms)")
        };
        let (count, per) = s.split_once('/').ok_or_else(|| bad("no '/'"))?;
        let count: i32 = count
            .trim()
            .parse()
            .map_err(|_| bad("the count is not a whole number"))?;
        if !(1..=RATE_COUNT_MAX).contains(&count) {
            return Err(bad(&format!("the count must be 1 to {RATE_COUNT_MAX}")));
        }
        let per = per.trim();
        let per = if per.starts_with(|c: char| c.is_ascii_digit()) {
            humantime::parse_duration(per).map_err(|e| bad(&e.to_string()))?
        } else {
            match per {
                "s" | "sec" | "second" => std::time::Duration::from_secs(1),
                "m" | "min" | "minute" => std::time::Duration::from_secs(60),
                "h" | "hour" => std::time::Duration::from_secs(3600),
                _ => return Err(bad("unknown unit")),
            }
        };
        if per.is_zero() {
            return Err(bad("the window must be longer than 0"));
        }
        Ok(RateLimit { count, per })
    }
}

impl std::fmt::Display for RateLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.per.as_secs_f64() {
            1.0 => write!(f, "{}/s", self.count),
            60.0 => write!(f, "{}/min", self.count),
            3600.0 => write!(f, "{}/h", self.count),
            _ => write!(f, "{}/{}", self.count, humantime::format_duration(self.per)),
        }
    }
}

impl Serialize for RateLimit {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Every queue with settings or waiting jobs, by name.
pub async fn list<C: GenericClient>(db: &C) -> Result<Vec<QueueSettings>> {
    let rows = Db::unnamed(db.client())
        .query(&QUEUE_LIST, &[])
        .await
        .map_err(Error::db("cannot list the queues"))?;
    Ok(rows
        .iter()
        .map(|r| QueueSettings {
            queue: r.get(0),
            paused: r.get(1),
            paused_at: r.get(2),
            max_running: r.get(3),
            rate: rate_of(r.get(4), r.get(5)),
            limit_key_path: r.get(6),
            fair_keys: r.get(7),
            max_running_per_key: r.get(8),
            key_max_running: serde_json::from_str(r.get::<_, &str>(9)).unwrap_or_default(),
            rate_per_key: rate_of(r.get(10), r.get(11)),
            shed_under_pressure: r.get(12),
            paused_by: r.get(13),
        })
        .collect())
}

/// A rate from its count and window in seconds (either NULL: none).
fn rate_of(count: Option<i32>, secs: Option<f64>) -> Option<RateLimit> {
    count.zip(secs).map(|(count, secs)| RateLimit {
        count,
        per: std::time::Duration::from_secs_f64(secs),
    })
}

/// Pause `queue`: no worker starts a new job of it until [`resume`].
/// Returns whether it was running before (false: already paused).
pub async fn pause<C: GenericClient>(db: &C, queue: &str) -> Result<bool> {
    check_name(queue)?;
    let row = Db::unnamed(db.client())
        .query_one(&QUEUE_PAUSE, &[&queue])
        .await
        .map_err(Error::db("cannot pause the queue"))?;
    Ok(row.get(0))
}

/// Resume `queue`. Returns whether it was paused before.
pub async fn resume<C: GenericClient>(db: &C, queue: &str) -> Result<bool> {
    check_name(queue)?;
    let row = Db::unnamed(db.client())
        .query_one(&QUEUE_RESUME, &[&queue])
        .await
        .map_err(Error::db("cannot resume the queue"))?;
    Ok(row.get(0))
}

/// Limit `queue` to `max_running` jobs running at once across every worker
/// (`None`: no limit). Lowering it stops no running job: no new job of the
/// queue starts until those above the new limit have ended.
pub async fn set_max_running<C: GenericClient>(
    db: &C,
    queue: &str,
    max_running: Option<i32>,
) -> Result<()> {
    check_name(queue)?;
    if max_running.is_some_and(|n| n < 1) {
        return Err(Error::Config(
            "--max-running must be at least 1 (use --no-max-running to remove the limit)".into(),
        ));
    }
    if max_running.is_some_and(|n| n > crate::config::MAX_RUNNING_MAX) {
        return Err(Error::Config(format!(
            "--max-running must be at most {}",
            crate::config::MAX_RUNNING_MAX
        )));
    }
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_MAX_RUNNING, &[&queue, &max_running])
        .await
        .map_err(Error::db("cannot set the queue's max_running"))?;
    Ok(())
}

/// Rate-limit `queue` (`None`: no rate limit): at most `rate.count` of its
/// jobs are admitted in any window of `rate.per`, across every worker.
/// Lowering it keeps the newest admissions, so a window that begins after
/// the change admits at most the new count.
pub async fn set_rate<C: GenericClient>(
    db: &C,
    queue: &str,
    rate: Option<RateLimit>,
) -> Result<()> {
    set_rate_with(
        db,
        queue,
        rate,
        &QUEUE_SET_RATE,
        "cannot set the queue's rate",
        |r| {
            format!(
            "invalid rate {r}: the count must be 1 to {RATE_COUNT_MAX} and the window longer than 0"
        )
        },
    )
    .await
}

/// Rate-limit each limit key of `queue` (`None`: no per-key rate): at most
/// `rate.count` jobs of any one key are admitted in any window of
/// `rate.per`, across every worker. Jobs without a key are not limited.
pub async fn set_rate_per_key<C: GenericClient>(
    db: &C,
    queue: &str,
    rate: Option<RateLimit>,
) -> Result<()> {
    set_rate_with(
        db,
        queue,
        rate,
        &QUEUE_SET_RATE_PER_KEY,
        "cannot set the queue's rate_per_key",
        |r| {
            format!(
                "invalid --rate-per-key {r}: the count must be 1 to {RATE_COUNT_MAX} and the window longer than 0 (use --no-rate-per-key to remove it)"
            )
        },
    )
    .await
}

/// A rate setting (`statement`: the queue's or its keys'): validated
/// (`invalid` words the refusal), then set.
async fn set_rate_with<C: GenericClient>(
    db: &C,
    queue: &str,
    rate: Option<RateLimit>,
    statement: &Sql,
    context: &'static str,
    invalid: impl Fn(RateLimit) -> String,
) -> Result<()> {
    check_name(queue)?;
    if let Some(r) = rate {
        if !(1..=RATE_COUNT_MAX).contains(&r.count) || r.per.is_zero() {
            return Err(Error::Config(invalid(r)));
        }
    }
    let count = rate.map(|r| r.count);
    let per = rate.map(|r| r.per.as_secs_f64());
    Db::unnamed(db.client())
        .execute(statement, &[&queue, &count, &per])
        .await
        .map_err(Error::db(context))?;
    Ok(())
}

/// At most `max_running` jobs of any one limit key of `queue` run at once
/// across every worker (`None`: no per-key limit). Lowering it stops no
/// running job: no new job of a key starts until its jobs above the new
/// limit have ended.
pub async fn set_max_running_per_key<C: GenericClient>(
    db: &C,
    queue: &str,
    max_running: Option<i32>,
) -> Result<()> {
    check_name(queue)?;
    check_limit("--max-running-per-key", max_running)?;
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_MAX_RUNNING_PER_KEY, &[&queue, &max_running])
        .await
        .map_err(Error::db("cannot set the queue's max_running_per_key"))?;
    Ok(())
}

/// Key `key` of `queue` runs at most `max_running` jobs at once (`None`:
/// the queue's per-key limit again).
pub async fn set_key_max_running<C: GenericClient>(
    db: &C,
    queue: &str,
    key: &str,
    max_running: Option<i32>,
) -> Result<()> {
    check_name(queue)?;
    check_limit("--max-running", max_running)?;
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_KEY_MAX_RUNNING, &[&queue, &key, &max_running])
        .await
        .map_err(Error::db("cannot set the key's max_running"))?;
    Ok(())
}

fn check_limit(flag: &str, max_running: Option<i32>) -> Result<()> {
    match max_running {
        Some(n) if !(1..=crate::config::MAX_RUNNING_MAX).contains(&n) => {
            Err(Error::Config(format!(
                "{flag} must be between 1 and {} (use --no-{} to remove the limit)",
                crate::config::MAX_RUNNING_MAX,
                flag.trim_start_matches("--")
            )))
        }
        _ => Ok(()),
    }
}

/// Most bytes of a `limit_key_path` (a payload field name).
pub const LIMIT_KEY_PATH_MAX: usize = 200;

/// Jobs of `queue` enqueued without a limit key take the payload's
/// top-level field `path` as their key (`None`: no such field). Applies to
/// jobs inserted from now on.
pub async fn set_limit_key_path<C: GenericClient>(
    db: &C,
    queue: &str,
    path: Option<&str>,
) -> Result<()> {
    check_name(queue)?;
    if let Some(p) = path {
        if p.is_empty() || p.len() > LIMIT_KEY_PATH_MAX || p.chars().any(char::is_control) {
            return Err(Error::Config(format!(
                "--limit-key-path must name a top-level payload field (1 to {LIMIT_KEY_PATH_MAX} bytes, no control characters), e.g. customer_id; got {p:?}"
            )));
        }
    }
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_LIMIT_KEY_PATH, &[&queue, &path])
        .await
        .map_err(Error::db("cannot set the queue's limit_key_path"))?;
    Ok(())
}

/// Take `queue`'s ready jobs in rotation between limit keys (`true`) or in
/// plain claim order (`false`).
pub async fn set_fair_keys<C: GenericClient>(db: &C, queue: &str, fair: bool) -> Result<()> {
    check_name(queue)?;
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_FAIR_KEYS, &[&queue, &fair])
        .await
        .map_err(Error::db("cannot set the queue's fair_keys"))?;
    Ok(())
}

/// Shed `queue` under pressure (`true`): the governor pauses it when
/// `pgwake.pressure()` turns critical and resumes it when the level falls
/// below critical, unless an operator paused or resumed it in between.
pub async fn set_shed_under_pressure<C: GenericClient>(
    db: &C,
    queue: &str,
    shed: bool,
) -> Result<()> {
    check_name(queue)?;
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_SHED, &[&queue, &shed])
        .await
        .map_err(Error::db("cannot set the queue's shed_under_pressure"))?;
    Ok(())
}

fn check_name(queue: &str) -> Result<()> {
    if queue.is_empty() {
        return Err(Error::Config("the queue name must not be empty".into()));
    }
    Ok(())
}

/// Render as a fixed-width table.
pub fn render_table(queues: &[QueueSettings]) -> String {
    let width = queues
        .iter()
        .map(|q| q.queue.chars().count())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!(
        "{:<width$}  {:<8}  {:>11}  {:>10}  {:>11}  {:>12}  {:<9}  {:<14}  {:<4}  PAUSED AT\n",
        "QUEUE",
        "STATE",
        "MAX RUNNING",
        "RATE",
        "PER KEY",
        "RATE PER KEY",
        "FAIR KEYS",
        "LIMIT KEY PATH",
        "SHED"
    );
    for q in queues {
        // "shed": paused by the governor, resumed when the pressure falls.
        let state = match (q.paused, q.paused_by.as_deref()) {
            (true, Some("pressure")) => "shed",
            (true, _) => "paused",
            (false, _) => "running",
        };
        let shed = if q.shed_under_pressure { "yes" } else { "-" };
        let max = q.max_running.map(|n| n.to_string()).unwrap_or("-".into());
        let rate = q.rate.map(|r| r.to_string()).unwrap_or("-".into());
        let key_rate = q.rate_per_key.map(|r| r.to_string()).unwrap_or("-".into());
        let at = q.paused_at.map(|t| t.to_rfc3339()).unwrap_or_default();
        let fair = if q.fair_keys { "yes" } else { "-" };
        let per_key = match (q.max_running_per_key, q.key_max_running.len()) {
            (Some(n), 0) => n.to_string(),
            (Some(n), k) => format!("{n} (+{k})"),
            (None, 0) => "-".into(),
            (None, k) => format!("- (+{k})"),
        };
        let path = q.limit_key_path.as_deref().unwrap_or("-");
        out.push_str(&format!(
            "{:<width$}  {:<8}  {max:>11}  {rate:>10}  {per_key:>11}  {key_rate:>12}  {fair:<9}  {path:<14}  {shed:<4}  {at}\n",
            q.queue, state
        ));
    }
    if queues.is_empty() {
        out.push_str("(no queues)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rates_parse_and_print_back() {
        for (text, count, per, shown) in [
            ("20/s", 20, Duration::from_secs(1), "20/s"),
            ("600/min", 600, Duration::from_secs(60), "600/min"),
            ("5/h", 5, Duration::from_secs(3600), "5/h"),
            ("1/50ms", 1, Duration::from_millis(50), "1/50ms"),
            ("3/10s", 3, Duration::from_secs(10), "3/10s"),
            ("100/1m", 100, Duration::from_secs(60), "100/min"),
        ] {
            let r: RateLimit = text.parse().unwrap();
            assert_eq!((r.count, r.per), (count, per), "{text}");
            assert_eq!(r.to_string(), shown);
        }
    }

    #[test]
    fn bad_rates_say_why() {
        for (text, why) in [
            ("20", "no '/'"),
            ("x/s", "whole number"),
            ("0/s", "1 to 100000"),
            ("100001/s", "1 to 100000"),
            ("20/fortnight", "unknown unit"),
            ("20/0s", "longer than 0"),
            ("-1/s", "1 to 100000"),
        ] {
            let e = text.parse::<RateLimit>().unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
            assert!(e.contains("N/s"), "{text}: {e}");
        }
    }
}
