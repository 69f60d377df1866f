//! The worker registry as operators read it (`pgwake.workers`, migration
//! 0016; `functions/workers.sql`): the live workers, and the waiting jobs no
//! live worker can run. Workers keep their rows up to date
//! (`services::fleet`).

use serde::Serialize;

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
