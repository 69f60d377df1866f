//! Repairs of a limit key's slot rows (migration 0022). A claim of a queue
//! with per-key limits reports a key that has a ready job but fewer slot
//! rows than its limit (`pgwake.fair_key_jobs`, functions/claims.sql): a job
//! of it was inserted while its rows were being deleted (the rescuer's
//! sweep of keys without jobs, or a limit change), and its insert trigger
//! saw them still there. Such a key would never be claimed again.
//!
//! ```text
//!   claim ──▶ rows + (id NULL, repair_key K) ──▶ report(queue, [K])
//!                                                   │ spawned, own statement
//!   pgwake.repair_key_slots(queue, [K]) ◀───────────┘  adds rows 1..limit,
//!                                                      NOTIFY wakes a claim
//! ```
//!
//! The rows are added in an autocommit statement of their own, never in
//! the claim: a tx-mode claim's transaction lasts as long as its jobs run,
//! and rows it inserted would make every producer of the key wait for it.
//! A repair already under way for a key is not started twice.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use crate::claim::run::row::{ClaimRow, Mode};
use crate::db::sql::{Db, REPAIR_KEY_SLOTS};

/// The repairs this worker has under way.
pub(crate) struct KeyRepairs {
    pool: deadpool_postgres::Pool,
    under_way: Arc<Mutex<HashSet<(String, String)>>>,
}

impl KeyRepairs {
    /// Repairs run on connections of `pool`.
    pub(crate) fn new(pool: deadpool_postgres::Pool) -> KeyRepairs {
        KeyRepairs {
            pool,
            under_way: Default::default(),
        }
    }

    /// Split the rows of a limited claim of `mode` into its jobs and the
    /// keys it reported (rows whose id is NULL): keys to repair, whose
    /// repair of `queue` this starts, and the key where the claim's walk
    /// between keys stopped at its bound. Returns the jobs and that key.
    pub(crate) fn take_reports(
        &self,
        queue: &str,
        rows: Vec<tokio_postgres::Row>,
        mode: Mode,
    ) -> (Vec<tokio_postgres::Row>, Option<String>) {
        let (jobs, reports): (Vec<_>, Vec<_>) = rows
            .into_iter()
            .partition(|r| !ClaimRow::read(r, mode).is_report());
        let keys: Vec<String> = reports
            .iter()
            .filter_map(|r| ClaimRow::read(r, mode).key_to_repair())
            .collect();
        if !keys.is_empty() {
            self.report(queue, keys);
        }
        let stop = reports
            .iter()
            .find_map(|r| ClaimRow::read(r, mode).walk_stopped_at());
        (jobs, stop)
    }

    /// Add the missing rows of `keys` of `queue`, in a task of its own.
    fn report(&self, queue: &str, keys: Vec<String>) {
        let keys: Vec<String> = {
            let mut under_way = self.under_way.lock().unwrap_or_else(|e| e.into_inner());
            keys.into_iter()
                .filter(|k| under_way.insert((queue.to_string(), k.clone())))
                .collect()
        };
        if keys.is_empty() {
            return;
        }
        let pool = self.pool.clone();
        let under_way = self.under_way.clone();
        let queue = queue.to_string();
        tokio::spawn(async move {
            match repair(&pool, &queue, &keys).await {
                Ok(added) => tracing::info!(
                    queue = %queue,
                    keys = keys.len(),
                    rows = added,
                    "added the missing slot rows of limit keys that had ready jobs"
                ),
                // A producer inserting the same rows holds them: the next
                // claim that visits the key reports it again.
                Err(e) => tracing::debug!(
                    queue = %queue,
                    error = %e,
                    "could not repair the slot rows of limit keys now; the next claim reports them again"
                ),
            }
            let mut under_way = under_way.lock().unwrap_or_else(|e| e.into_inner());
            for k in keys {
                under_way.remove(&(queue.clone(), k));
            }
        });
    }
}

async fn repair(
    pool: &deadpool_postgres::Pool,
    queue: &str,
    keys: &[String],
) -> crate::error::Result<i64> {
    let mut conn =
        crate::db::connect::PooledConn::get(pool, "claim: no connection to repair key slots")
            .await?;
    let r = Db::unnamed(&conn)
        .query_one(&REPAIR_KEY_SLOTS, &[&queue, &keys])
        .await;
    Ok(conn
        .check(r)
        .map_err(crate::error::Error::db("claim: repair key slots"))?
        .get(0))
}
