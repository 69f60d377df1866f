//! `pgwake dead`: list, retry and purge the dead-letter table.

use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

/// A row of `pgwake.dead_jobs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct DeadJob {
    /// Job id.
    pub id: i64,
    /// Queue.
    pub queue: String,
    /// Task.
    pub task: String,
    /// Payload.
    pub payload: serde_json::Value,
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
                "say which dead jobs: --id N (repeatable) or --all (optionally with --queue)"
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
    let rows = db
        .query(include_str!("sql/dead_list.sql"), &[&queue, &limit])
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

/// Move selected dead jobs back into the queue (attempts reset, ready now);
/// returns their ids.
pub async fn retry<C: GenericClient>(db: &C, sel: &Selection) -> Result<Vec<i64>> {
    sel.check()?;
    let rows = db
        .query(include_str!("sql/dead_retry.sql"), &[&sel.ids, &sel.queue])
        .await
        .map_err(Error::db("cannot retry dead jobs"))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
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
    db.execute(
        include_str!("sql/dead_purge.sql"),
        &[&sel.ids, &sel.queue, &secs],
    )
    .await
    .map_err(Error::db("cannot purge dead jobs"))
}
