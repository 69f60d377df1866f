//! What the console's overview reads besides the gauges
//! ([`crate::admin::gauges`]): jobs running and retrying per queue and what
//! the limits use (per limit key too), jobs finished per minute (history on), what holds back the vacuum
//! horizon, and the queue tables' estimated sizes. Every read is bounded on
//! any backlog (index ranges, catalog views, estimates: never a `count(*)`
//! over the queue or the history) and takes no lock.

use serde::Serialize;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};

/// How many ready jobs of each (queue, priority), in claim order, are
/// checked for a running tx-mode claim ([`QueueActivity::tx_running`]).
pub const TX_RUNNING_WINDOW: i64 = crate::admin::gauges::RUNNING_CHECK_WINDOW;

/// One queue's jobs in flight and limit use.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueueActivity {
    /// The queue.
    pub queue: String,
    /// Lease-mode jobs in flight (`pgwake.leased_jobs`).
    pub leased: i64,
    /// Tx-mode jobs a claim transaction holds, among the first
    /// [`TX_RUNNING_WINDOW`] ready jobs of each priority.
    pub tx_running: i64,
    /// Slots of its `max-running` limit in use (`None`: no limit).
    pub slots_used: Option<i64>,
    /// Admissions within its rate window (0 without a rate limit).
    pub rate_used: i64,
    /// Jobs waiting out a retry backoff (scheduled, attempts > 0), among
    /// the first [`TX_RUNNING_WINDOW`] scheduled jobs of each priority.
    pub retrying: i64,
}

/// Per queue: jobs running, jobs retrying and limit use (queues with none
/// of these are left out).
pub async fn queues(client: &tokio_postgres::Client) -> Result<Vec<QueueActivity>> {
    let rows = Db::unnamed(client)
        .query(&sql::ACTIVITY_QUEUES, &[&TX_RUNNING_WINDOW])
        .await
        .map_err(Error::db("reading the queues' activity"))?;
    Ok(rows
        .iter()
        .map(|r| QueueActivity {
            queue: r.get(0),
            leased: r.get(1),
            tx_running: r.get(2),
            slots_used: r.get(3),
            rate_used: r.get(4),
            retrying: r.get(5),
        })
        .collect())
}

/// Jobs running per (queue, limit key) of `keys`, as the key's running
/// limit counts them: its key slots held and its jobs running without a
/// slot. One index range per pair; pairs come back in no set order.
pub async fn key_running(
    client: &tokio_postgres::Client,
    keys: &[(String, String)],
) -> Result<Vec<((String, String), i64)>> {
    let (queues, limit_keys): (Vec<&str>, Vec<&str>) =
        keys.iter().map(|(q, k)| (q.as_str(), k.as_str())).unzip();
    let rows = Db::unnamed(client)
        .query(&sql::ACTIVITY_KEYS, &[&queues, &limit_keys])
        .await
        .map_err(Error::db("reading the limit keys' running jobs"))?;
    Ok(rows
        .iter()
        .map(|r| ((r.get(0), r.get(1)), r.get(2)))
        .collect())
}

/// Jobs finished per queue in the last `window`, from the history; `None`
/// when history is off (`pgwake run --keep-finished` turns it on).
pub async fn finished(
    client: &tokio_postgres::Client,
    window: std::time::Duration,
) -> Result<Option<Vec<(String, i64)>>> {
    let keep: Option<f64> = Db::unnamed(client)
        .query_one(&sql::HISTORY_SETTINGS_GET, &[])
        .await
        .map_err(Error::db("reading the history setting"))?
        .get(0);
    if keep.is_none() {
        return Ok(None);
    }
    let rows = Db::unnamed(client)
        .query(&sql::ACTIVITY_FINISHED, &[&window.as_secs_f64()])
        .await
        .map_err(Error::db("reading finished jobs"))?;
    Ok(Some(rows.iter().map(|r| (r.get(0), r.get(1))).collect()))
}

/// Something that keeps the vacuum horizon back: a session with an old
/// snapshot or transaction, a replication slot, a prepared transaction.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HorizonHolder {
    /// `session`, `replication slot` or `prepared transaction`.
    pub kind: String,
    /// The server process (sessions).
    pub pid: Option<i32>,
    /// Its application name (else its backend type), slot name or
    /// transaction id.
    pub who: String,
    /// Its state (`active`, `idle in transaction`, …).
    pub state: Option<String>,
    /// Age of its open transaction, seconds.
    pub xact_age_seconds: Option<f64>,
    /// Transactions since the oldest snapshot it holds.
    pub xmin_age: Option<i64>,
    /// Its current or last statement, cut at 2,000 characters (shown only
    /// to roles allowed to see it: `pg_read_all_stats`).
    pub query: Option<String>,
}

/// The `sessions` sessions with the oldest snapshots or transactions, and
/// every replication slot and prepared transaction holding an xmin.
pub async fn horizon(client: &tokio_postgres::Client, sessions: i64) -> Result<Vec<HorizonHolder>> {
    let rows = Db::unnamed(client)
        .query(&sql::ACTIVITY_HORIZON, &[&sessions])
        .await
        .map_err(Error::db("reading what holds the vacuum horizon"))?;
    Ok(rows
        .iter()
        .map(|r| HorizonHolder {
            kind: r.get(0),
            pid: r.get(1),
            who: r.get::<_, Option<String>>(2).unwrap_or_default(),
            state: r.get(3),
            xact_age_seconds: r.get(4),
            xmin_age: r.get(5),
            query: r.get(6),
        })
        .collect())
}

/// One queue table's size, as the statistics have it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TableEstimate {
    /// `jobs`, `leased_jobs`, `dead_jobs` or `finished_jobs`.
    pub table: String,
    /// Estimated rows (`pg_class.reltuples`, as the last ANALYZE or
    /// VACUUM left it).
    pub estimated_rows: i64,
    /// Dead tuples (`pg_stat_user_tables.n_dead_tup`).
    pub dead_tuples: i64,
    /// Its last vacuum, manual or automatic.
    pub last_vacuum: Option<chrono::DateTime<chrono::Utc>>,
}

/// The queue tables' estimated rows and dead tuples.
pub async fn tables(client: &tokio_postgres::Client) -> Result<Vec<TableEstimate>> {
    let rows = Db::unnamed(client)
        .query(&sql::ACTIVITY_TABLES, &[])
        .await
        .map_err(Error::db("reading the queue tables' statistics"))?;
    Ok(rows
        .iter()
        .map(|r| TableEstimate {
            table: r.get(0),
            estimated_rows: r.get(1),
            dead_tuples: r.get(2),
            last_vacuum: r.get(3),
        })
        .collect())
}
