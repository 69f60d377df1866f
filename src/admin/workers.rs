//! The worker registry as operators read it (`pgwake.workers`, migration
//! 0016; `functions/workers.sql`): the live workers, and the waiting jobs no
//! live worker can run. Workers keep their rows up to date
//! (`services::fleet`).

use serde::{Deserialize, Serialize};

use crate::db::sql::{self, Db};

/// Jobs of one queue and task that no live worker can run: no live worker
/// works the queue with a handler for the task (or a catch-all).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Unserved {
    /// The queue.
    pub queue: String,
    /// The task.
    pub task: String,
    /// How many, among the first jobs of each queue and priority (a lower
    /// bound when there are more).
    pub jobs: i64,
    /// How long the longest-waiting of them has been ready, in seconds.
    pub oldest_age_seconds: f64,
}

/// Jobs per queue and priority that [`unserved`] looks at when `pgwake
/// stats` asks.
pub const UNSERVED_HEAD: i32 = 1000;
/// (queue, priority) pairs it looks at, at most.
pub const UNSERVED_PAIRS_MAX: i32 = 100_000;

/// `pgwake.unserved_jobs(head, pairs_max)`: ready jobs at the heads of their
/// queues (`head` per queue and priority, over at most `pairs_max` pairs)
/// that no live worker can run. Jobs no worker claims stay at the head of
/// their queue, so the heads find them at a bounded cost.
pub async fn unserved(
    client: &tokio_postgres::Client,
    head: i32,
    pairs_max: i32,
) -> std::result::Result<Vec<Unserved>, tokio_postgres::Error> {
    let rows = Db::unnamed(client)
        .query(&sql::UNSERVED_JOBS, &[&head, &pairs_max])
        .await?;
    Ok(rows
        .iter()
        .map(|r| Unserved {
            queue: r.get(0),
            task: r.get(1),
            jobs: r.get(2),
            oldest_age_seconds: r.get(3),
        })
        .collect())
}

/// One worker process in the registry.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WorkerInfo {
    /// Its registry id.
    pub id: String,
    /// Host name.
    pub host: String,
    /// Process id on that host.
    pub pid: i32,
    /// pgwake version.
    pub version: String,
    /// Its connections' `application_name`.
    pub application_name: String,
    /// The queues it works (`None`: every queue).
    pub queues: Option<Vec<String>>,
    /// Tasks it has a handler for (`*`: a catch-all).
    pub tasks: Vec<String>,
    /// Its handlers and their delivery modes, as JSON
    /// (`[{"task": …, "mode": "tx"|"lease"}]`).
    pub handlers: String,
    /// Jobs it runs at once, at most.
    pub concurrency: i32,
    /// Jobs it ran at its last renewal.
    pub running: i32,
    /// When it started.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Its last renewal (heartbeat).
    pub seen_at: chrono::DateTime<chrono::Utc>,
    /// Whether it is alive (renewed within its time to live); a worker that
    /// died without removing its row shows as gone for an hour.
    pub live: bool,
    /// Its persistent handlers' processes at its last renewal (migration
    /// 0029; empty for a worker without any).
    pub processes: Vec<ProcessPool>,
}

/// One pool of a worker's persistent handler processes, as it wrote it to
/// the registry (`pgwake.workers.processes`, migration 0029).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(default)]
#[non_exhaustive]
pub struct ProcessPool {
    /// The command, as logs and metrics name it (escaped, at most 80
    /// characters).
    pub command: String,
    /// The tasks the worker routes to it (`*`: the catch-all).
    pub tasks: Vec<String>,
    /// Processes running and past their hello.
    pub live: u64,
    /// Processes configured (`--processes`).
    pub processes: u64,
    /// Jobs in flight on the live processes.
    pub in_flight: u64,
    /// Jobs the live processes take at once (the sum of their hellos'
    /// `inflight`).
    pub capacity: u64,
    /// Restarts so far (crashes, kills, recycling, failed starts).
    pub restarts: u64,
    /// Jobs the worker started that wait for a process with room.
    pub waiting: u64,
}

/// A registry row's `processes` JSON; what does not parse (a row written
/// by hand) reads as none.
fn pools(json: &str) -> Vec<ProcessPool> {
    serde_json::from_str(json).unwrap_or_default()
}

/// Every worker in the registry: the live ones, then those gone within the
/// last hour without removing their row, newest first (at most 1,000).
pub async fn list(client: &tokio_postgres::Client) -> crate::error::Result<Vec<WorkerInfo>> {
    read(client, &sql::WORKERS_LIST, &[]).await
}

/// Live workers by id, at most `limit` from the `offset`-th: one page of the
/// console's Workers page. Reads the rows up to the page, not the registry.
pub async fn live_page(
    client: &tokio_postgres::Client,
    offset: i64,
    limit: i64,
) -> crate::error::Result<Vec<WorkerInfo>> {
    read(client, &sql::WORKERS_PAGE, &[&limit, &offset]).await
}

/// Workers gone within the last hour without removing their row, newest
/// first, at most `limit`.
pub async fn gone(
    client: &tokio_postgres::Client,
    limit: i64,
) -> crate::error::Result<Vec<WorkerInfo>> {
    read(client, &sql::WORKERS_GONE, &[&limit]).await
}

async fn read(
    client: &tokio_postgres::Client,
    statement: &sql::Sql,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> crate::error::Result<Vec<WorkerInfo>> {
    let rows = Db::unnamed(client)
        .query(statement, params)
        .await
        .map_err(crate::error::Error::db("reading the worker registry"))?;
    Ok(rows
        .iter()
        .map(|r| WorkerInfo {
            id: r.get(0),
            host: r.get(1),
            pid: r.get(2),
            version: r.get(3),
            application_name: r.get(4),
            queues: r.get(5),
            tasks: r.get(6),
            handlers: r.get(7),
            concurrency: r.get(8),
            running: r.get(9),
            started_at: r.get(10),
            seen_at: r.get(11),
            live: r.get(12),
            processes: pools(r.get(13)),
        })
        .collect())
}
