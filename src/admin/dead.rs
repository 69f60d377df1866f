//! `pgwake dead`: list, retry and purge the dead-letter table.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::db::sql::{self, Db};

use crate::error::{Error, Result};

/// How many dead jobs [`list`] shows when not told otherwise (`pgwake dead
/// list --limit`).
pub const LIST_LIMIT_DEFAULT: i64 = 50;

/// A row of `pgwake.dead_jobs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeadJob {
    /// Job id.
    pub id: i64,
    /// Queue.
    pub queue: String,
    /// Task.
    pub task: String,
    /// The payload exactly as stored (`payload::text`). In JSON output it is
    /// embedded as JSON, or as a string when it is too deeply nested to
    /// re-read (more than 128 levels).
    #[serde(serialize_with = "raw_or_text")]
    pub payload: String,
    /// Attempts used.
    pub attempts: i32,
    /// Attempts allowed.
    pub max_attempts: i32,
    /// Why it died.
    pub last_error: Option<String>,
    /// When it died (RFC 3339).
    pub failed_at: String,
}

/// Which dead jobs an operation touches. An empty selection is refused:
/// `--all` must be said out loud.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// These ids only.
    pub ids: Option<Vec<i64>>,
    /// This queue only.
    pub queue: Option<String>,
    /// Every dead job (subject to `queue`).
    pub all: bool,
}

impl Selection {
    fn check(&self) -> Result<()> {
        if self.ids.is_none() && !self.all {
            return Err(Error::Config(
                "say which dead jobs: their ids (`pgwake dead retry 41 42`, or --id N) or --all (optionally with --queue)"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The newest `limit` dead jobs.
pub async fn list<C: GenericClient>(
    db: &C,
    queue: Option<&str>,
    limit: i64,
) -> Result<Vec<DeadJob>> {
    let rows = Db::unnamed(db.client())
        .query(&sql::DEAD_LIST, &[&queue, &limit])
        .await
        .map_err(Error::db("cannot list dead jobs"))?;
    Ok(rows
        .iter()
        .map(|r| DeadJob {
            id: r.get(0),
            queue: r.get(1),
            task: r.get(2),
            payload: r.get(3),
            attempts: r.get(4),
            max_attempts: r.get(5),
            last_error: r.get(6),
            failed_at: humantime::format_rfc3339_millis(r.get::<_, SystemTime>(7)).to_string(),
        })
        .collect())
}

/// The ids of `sel` that name no dead job (of `sel.queue`, if set), e.g. to
/// refuse a retry of a job that is not dead before changing anything.
pub async fn missing<C: GenericClient>(db: &C, sel: &Selection) -> Result<Vec<i64>> {
    let Some(ids) = &sel.ids else {
        return Ok(Vec::new());
    };
    let rows = Db::unnamed(db.client())
        .query(&sql::DEAD_MISSING, &[ids, &sel.queue])
        .await
        .map_err(Error::db("cannot look up dead jobs"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Move selected dead jobs back into the queue (attempts reset, ready now);
/// returns their ids.
pub async fn retry<C: GenericClient>(db: &C, sel: &Selection) -> Result<Vec<i64>> {
    // Ids name their jobs: cancelled ones too. `all` means the dead ones.
    retry_where(db, sel, sel.ids.is_some()).await
}

/// [`retry`], cancelled jobs included with `all`: a job an operator
/// cancelled on purpose is revived only when asked for in so many words
/// (`pgwake dead retry --all --include-cancelled`).
pub async fn retry_including_cancelled<C: GenericClient>(
    db: &C,
    sel: &Selection,
) -> Result<Vec<i64>> {
    retry_where(db, sel, true).await
}

async fn retry_where<C: GenericClient>(
    db: &C,
    sel: &Selection,
    cancelled: bool,
) -> Result<Vec<i64>> {
    sel.check()?;
    let rows = Db::unnamed(db.client())
        .query(&sql::DEAD_RETRY, &[&sel.ids, &sel.queue, &cancelled])
        .await
        .map_err(Error::db("cannot retry dead jobs"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// How many cancelled jobs `sel` covers (what a retry of `all` leaves).
pub async fn cancelled_count<C: GenericClient>(db: &C, sel: &Selection) -> Result<i64> {
    let row = Db::unnamed(db.client())
        .query_one(&sql::DEAD_CANCELLED, &[&sel.ids, &sel.queue])
        .await
        .map_err(Error::db("cannot count cancelled jobs"))?;
    Ok(row.get(0))
}

/// Delete selected dead jobs (only those older than `older_than`, if
/// given); returns how many.
pub async fn purge<C: GenericClient>(
    db: &C,
    sel: &Selection,
    older_than: Option<Duration>,
) -> Result<u64> {
    if older_than.is_none() {
        sel.check()?;
    }
    let secs = older_than.map(|d| d.as_secs_f64());
    Db::unnamed(db.client())
        .execute(&sql::DEAD_PURGE, &[&sel.ids, &sel.queue, &secs])
        .await
        .map_err(Error::db("cannot purge dead jobs"))
}

/// Serialize stored JSON text as JSON when it can be re-read, else as a
/// string: `dead list --json` never fails on a payload PostgreSQL accepted.
fn raw_or_text<S: serde::Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    match serde_json::value::RawValue::from_string(text.to_string()) {
        Ok(raw) => raw.serialize(s),
        Err(_) => s.serialize_str(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(payload: &str) -> DeadJob {
        DeadJob {
            id: 1,
            queue: "q".into(),
            task: "t".into(),
            payload: payload.into(),
            attempts: 1,
            max_attempts: 1,
            last_error: None,
            failed_at: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn json_output_embeds_payloads_exactly() {
        let out =
            serde_json::to_string_pretty(&[job(r#"{"n": 12345678901234567890123}"#)]).unwrap();
        assert!(out.contains(r#""n": 12345678901234567890123"#), "{out}");
        let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
        let out = serde_json::to_string(&[job(&deep)]).unwrap();
        assert!(out.contains(&format!(":{}1]", "[".repeat(300))), "{out}");
    }
}
