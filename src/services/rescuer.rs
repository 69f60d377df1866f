//! The rescuer: every worker, every `rescue_interval` (jittered), moves
//! lease-mode jobs whose lease expired back into `pgwake.jobs` (the insert
//! trigger wakes everyone), or into `dead_jobs` when the expired run was
//! the last attempt. Safe to run on any number of workers at once: each
//! expired lease is moved exactly once (DELETE … SKIP LOCKED). It also
//! turns tx-mode batch marks that outlived their transaction into suspects
//! (`claim/tx/`), and forgets crash charges of jobs that are gone. Last, it
//! releases ordering keys whose next job stayed held (functions/keys.sql,
//! `release_stalled_keys`): the keys a release could not settle at once,
//! and a slice of every key with held jobs, so that no key stays held for
//! good. And it sweeps the slot rows of limit keys that have no job left
//! (functions/rescue.sql, `sweep_key_slots`), a slice of the keys per run,
//! so that one-off keys (a customer seen once) leave no rows behind.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::metrics;

/// Most expired leases moved per run.
pub const RESCUE_BATCH_DEFAULT: i64 = 1000;
/// Most ordering keys with held jobs looked at per run (the next run goes on
/// from the last one).
pub const KEY_SWEEP_BATCH: i64 = 1000;
/// Most limit keys whose slot rows are looked at per run (the next run goes
/// on from the last one).
pub const SLOT_SWEEP_BATCH: i64 = 1000;

/// What one rescue run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RescueReport {
    /// Jobs moved back to the queue.
    pub requeued: usize,
    /// Jobs moved to `dead_jobs` (their last attempt's lease expired).
    pub dead: usize,
    /// tx-mode batches found never to have reported (their jobs now run one
    /// at a time, each charged before it starts).
    pub stale_batches: usize,
    /// Expired leases that could not be moved (each logged at error level
    /// with its reason; they stay leased, and every run tries them again).
    pub failed: usize,
    /// Ordering keys whose next job was released because its release had
    /// been left for later (a producer was inserting a job of the key when
    /// the job before it ended).
    pub keys_rechecked: usize,
    /// Ordering keys whose next job was released though no release had been
    /// left for later: it was held with nothing of its key running (a missed
    /// release; logged at warn level).
    pub keys_stalled: usize,
    /// Slot rows of limit keys that had no job left, deleted.
    pub key_slots_swept: usize,
    /// Progress rows of runs that are over (their worker died mid-job),
    /// deleted (migration 0037).
    pub progress_expired: usize,
    /// Jobs waiting for parents that had all ended, released by the sweep
    /// (a missed release, e.g. a child added while its parent ran in tx
    /// mode; migration 0039, functions/flows.sql). Logged at warn level.
    pub flows_released: usize,
}

/// How the rescuer runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RescuerConfig {
    /// Time between runs, jittered ±25% (the worker's `--rescue-interval`;
    /// default [`RESCUE_INTERVAL_DEFAULT`](crate::config::RESCUE_INTERVAL_DEFAULT)).
    pub interval: Duration,
    /// Most expired leases moved per run (default [`RESCUE_BATCH_DEFAULT`]).
    pub batch: i64,
}

impl Default for RescuerConfig {
    fn default() -> Self {
        RescuerConfig {
            interval: crate::config::RESCUE_INTERVAL_DEFAULT,
            batch: RESCUE_BATCH_DEFAULT,
        }
    }
}

impl RescuerConfig {
    /// The defaults, running every `interval`.
    pub fn every(interval: Duration) -> Self {
        RescuerConfig {
            interval,
            ..RescuerConfig::default()
        }
    }
}

/// The rescuer service.
pub struct Rescuer {
    pool: deadpool_postgres::Pool,
    config: RescuerConfig,
    /// The last ordering key the sweep looked at (None: start over).
    key_sweep_after: std::sync::Mutex<Option<String>>,
    /// The last limit key (queue, key) whose slot rows the sweep looked at
    /// (None: start over).
    slot_sweep_after: std::sync::Mutex<Option<(String, String)>>,
    /// The last held child id the flows' sweep looked at (None: start over).
    flow_sweep_after: std::sync::Mutex<Option<i64>>,
}

impl Rescuer {
    /// A rescuer on `pool`.
    pub fn new(pool: deadpool_postgres::Pool, config: RescuerConfig) -> Rescuer {
        Rescuer {
            pool,
            config,
            key_sweep_after: std::sync::Mutex::new(None),
            slot_sweep_after: std::sync::Mutex::new(None),
            flow_sweep_after: std::sync::Mutex::new(None),
        }
    }

    /// Rescue until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(crate::services::poller::jitter(self.config.interval)) => {}
            }
            match self.run_once().await {
                Ok(r) => {
                    if r.requeued + r.dead > 0 {
                        tracing::warn!(
                            requeued = r.requeued,
                            dead = r.dead,
                            "rescued expired leases"
                        )
                    }
                    if r.keys_stalled > 0 {
                        tracing::warn!(
                            keys = r.keys_stalled,
                            "released ordering keys whose next job was held with nothing of its key running (a missed release)"
                        )
                    }
                    if r.key_slots_swept > 0 {
                        tracing::debug!(
                            rows = r.key_slots_swept,
                            "deleted the slot rows of limit keys that have no job left"
                        )
                    }
                    if r.flows_released > 0 {
                        tracing::warn!(
                            jobs = r.flows_released,
                            "released jobs whose parents had all ended (a missed release)"
                        )
                    }
                    if r.keys_rechecked > 0 {
                        tracing::debug!(
                            keys = r.keys_rechecked,
                            "released ordering keys left for a recheck"
                        )
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "rescuing expired leases failed; trying again next interval")
                }
            }
        }
    }

    /// Move every expired lease (up to a batch) once.
    pub async fn run_once(&self) -> Result<RescueReport> {
        let mut conn = crate::db::connect::PooledConn::get(&self.pool, "rescuer").await?;
        let r = Db::unnamed(&conn)
            .query(&sql::RESCUE, &[&self.config.batch])
            .await;
        let rows = conn.check(r).map_err(Error::db("rescuer"))?;
        let mut report = RescueReport::default();
        let r = Db::unnamed(&conn).query_one(&sql::ADOPT_STALE, &[]).await;
        report.stale_batches = conn
            .check(r)
            .map_err(Error::db("rescuer: adopt"))?
            .get::<_, i64>(0) as usize;
        let r = Db::unnamed(&conn)
            .execute(&sql::CLEANUP_ATTEMPTS, &[])
            .await;
        conn.check(r).map_err(Error::db("rescuer: cleanup"))?;
        let r = Db::unnamed(&conn).execute(&sql::ERRORS_EXPIRE, &[]).await;
        conn.check(r)
            .map_err(Error::db("rescuer: expire attempt errors"))?;
        let r = Db::unnamed(&conn).execute(&sql::SNOOZES_EXPIRE, &[]).await;
        conn.check(r)
            .map_err(Error::db("rescuer: expire snooze counts"))?;
        let r = Db::unnamed(&conn).execute(&sql::WAITS_EXPIRE, &[]).await;
        conn.check(r).map_err(Error::db("rescuer: expire waits"))?;
        let r = Db::unnamed(&conn).execute(&sql::SIGNALS_EXPIRE, &[]).await;
        conn.check(r)
            .map_err(Error::db("rescuer: expire kept signals"))?;
        let r = Db::unnamed(&conn).execute(&sql::SIGNALS_SWEEP, &[]).await;
        conn.check(r)
            .map_err(Error::db("rescuer: deliver kept signals"))?;
        let r = Db::unnamed(&conn).execute(&sql::PROGRESS_EXPIRE, &[]).await;
        report.progress_expired =
            conn.check(r)
                .map_err(Error::db("rescuer: expire progress"))? as usize;
        let after = self.key_sweep_after.lock().unwrap().clone();
        let r = Db::unnamed(&conn)
            .query_one(&sql::RELEASE_KEYS, &[&after, &KEY_SWEEP_BATCH])
            .await;
        let row = conn.check(r).map_err(Error::db("rescuer: ordering keys"))?;
        report.keys_rechecked = row.get::<_, i64>(0) as usize;
        report.keys_stalled = row.get::<_, i64>(1) as usize;
        *self.key_sweep_after.lock().unwrap() = row.get(2);
        let after = *self.flow_sweep_after.lock().unwrap();
        let r = Db::unnamed(&conn)
            .query_one(&sql::RELEASE_FLOWS, &[&after, &KEY_SWEEP_BATCH])
            .await;
        let row = conn.check(r).map_err(Error::db("rescuer: flows"))?;
        report.flows_released = row.get::<_, i64>(0) as usize;
        *self.flow_sweep_after.lock().unwrap() = row.get(1);
        let after = self.slot_sweep_after.lock().unwrap().clone();
        let (after_queue, after_key) = after.unzip();
        let r = Db::unnamed(&conn)
            .query_one(
                &sql::SWEEP_KEY_SLOTS,
                &[&after_queue, &after_key, &SLOT_SWEEP_BATCH],
            )
            .await;
        let row = conn.check(r).map_err(Error::db("rescuer: key slots"))?;
        report.key_slots_swept = row.get::<_, i64>(0) as usize;
        let next: (Option<String>, Option<String>) = (row.get(1), row.get(2));
        *self.slot_sweep_after.lock().unwrap() = next.0.zip(next.1);
        for row in &rows {
            let queue: String = row.get(0);
            let what: &str = row.get(1);
            match what {
                "failed" => {
                    report.failed += 1;
                    let id: i64 = row.get(2);
                    let error: Option<String> = row.get(3);
                    tracing::error!(
                        job = id,
                        queue = ?queue,
                        error = error.as_deref().unwrap_or(""),
                        "cannot rescue this expired lease; it stays leased and the rescue tries it again (the other leases were rescued)"
                    );
                    ::metrics::counter!(metrics::RESCUE_FAILURES).increment(1);
                    continue;
                }
                "dead" => report.dead += 1,
                _ => report.requeued += 1,
            }
            ::metrics::counter!(metrics::LEASES_RESCUED, "queue" => metrics::queue_label(&queue))
                .increment(1);
        }
        Ok(report)
    }
}
