//! Queue settings (migration 0009): `pgwake queue list | pause | resume |
//! set` and the same through SQL (`pgwake.pause_queue`,
//! `pgwake.resume_queue`, `pgwake.set_queue_max_running`,
//! triggers/queues.sql).
//!
//! ```text
//!  pgwake queue pause Q ──▶ pgwake.pause_queue(Q): row in pgwake.queues, paused
//!  every claim statement (src/sql/claim_*.sql) skips the queues paused there
//!      → no worker starts a job of Q; running jobs finish; survives restarts
//!  pgwake queue resume Q ──▶ pgwake.resume_queue(Q): paused = false, NOTIFY pgwake Q
//!      → idle workers wake and claim at once
//! ```
//!
//! Workers keep no copy of these settings: the claim reads the table, so a
//! change is seen by the next claim of every worker, with no restart and no
//! message that could be lost.

use serde::Serialize;
use tokio_postgres::GenericClient;

use crate::error::{Error, Result};
use crate::sql::{Db, QUEUE_LIST, QUEUE_PAUSE, QUEUE_RESUME, QUEUE_SET_MAX_RUNNING};

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
        })
        .collect())
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
    Db::unnamed(db.client())
        .execute(&QUEUE_SET_MAX_RUNNING, &[&queue, &max_running])
        .await
        .map_err(Error::db("cannot set the queue's max_running"))?;
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
        "{:<width$}  {:<7}  {:>11}  PAUSED AT\n",
        "QUEUE", "STATE", "MAX RUNNING"
    );
    for q in queues {
        let state = if q.paused { "paused" } else { "running" };
        let max = q.max_running.map(|n| n.to_string()).unwrap_or("-".into());
        let at = q.paused_at.map(|t| t.to_rfc3339()).unwrap_or_default();
        out.push_str(&format!(
            "{:<width$}  {:<7}  {max:>11}  {at}\n",
            q.queue, state
        ));
    }
    if queues.is_empty() {
        out.push_str("(no queues)\n");
    }
    out
}
