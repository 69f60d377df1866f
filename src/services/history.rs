//! The history maintenance service, run by every worker (one at a time
//! maintains, under an advisory lock): reads the database's history setting
//! into the claim path's [`Switch`], creates daily partitions ahead and
//! drops expired ones. What history records and how: `admin/history.rs`.
//! Each round also deletes the trace contexts of jobs that are gone
//! (`pgwake.sweep_job_traces`, functions/traces.sql) and their recorded
//! steps (`pgwake.sweep_job_steps`, functions/steps.sql), history on or off.

use std::sync::Arc;

use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::claim::outcome::results::Switch;
use crate::config::HistoryConfig;
use crate::db::sql::{self, Db};
use crate::error::{Error, Result};
use crate::metrics;

/// What one maintenance round did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenanceReport {
    /// The setting read (`None`: history off, nothing else was done).
    pub keep: Option<Duration>,
    /// Whether this worker maintained the partitions (false: history off,
    /// or another worker held the maintenance lock).
    pub maintained: bool,
    /// Partitions created.
    pub created: i32,
    /// Expired partitions dropped.
    pub dropped: i32,
    /// Rows they held (from the planner's statistics), plus rows deleted
    /// from the default partition.
    pub rows_dropped: i64,
    /// DDL that failed (e.g. a lock not obtained within the lock timeout);
    /// tried again next round.
    pub failed: Vec<String>,
    /// Trace contexts of jobs that are gone, deleted (at most
    /// 10,000 a round).
    pub traces_swept: i64,
    /// Recorded steps of jobs that are gone, deleted (those of at most
    /// 10,000 jobs a round).
    pub steps_swept: i64,
}

/// The most trace contexts one round deletes: a backlog of more goes in
/// later rounds, each one statement of bounded length.
pub(crate) const TRACE_SWEEP_BATCH: i64 = 10_000;

/// The history maintenance service, run by every worker; one at a time
/// maintains (advisory lock).
pub struct Maintenance {
    pool: deadpool_postgres::Pool,
    config: HistoryConfig,
    switch: Arc<Switch>,
}

impl Maintenance {
    /// A maintenance service on `pool`.
    pub fn new(pool: deadpool_postgres::Pool, config: HistoryConfig) -> Maintenance {
        Maintenance {
            pool,
            config,
            switch: Arc::default(),
        }
    }

    pub(crate) fn with_switch(mut self, switch: Arc<Switch>) -> Maintenance {
        self.switch = switch;
        self
    }

    /// Maintain every `maintenance_interval` (jittered) until `shutdown`.
    pub async fn run(self, shutdown: CancellationToken) {
        // Exported from the start (at 0), so dashboards and alerts see the
        // series before the first partition is ever dropped.
        for name in [
            metrics::HISTORY_PARTITIONS_DROPPED,
            metrics::HISTORY_ROWS_DROPPED,
            metrics::HISTORY_MAINTENANCE_FAILURES,
        ] {
            ::metrics::counter!(name).increment(0);
        }
        // The first round at once: a database where history was just turned
        // on has no daily partition yet.
        let mut first = true;
        loop {
            if !first {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(crate::services::poller::jitter(self.config.maintenance_interval)) => {}
                }
            }
            first = false;
            match self.run_once().await {
                Ok(r) if !r.failed.is_empty() => {
                    tracing::warn!(failed = ?r.failed, "history maintenance: some partitions could not be created or dropped; trying again next round")
                }
                Ok(r) if r.created + r.dropped > 0 => {
                    tracing::info!(
                        created = r.created,
                        dropped = r.dropped,
                        rows = r.rows_dropped,
                        "history partitions maintained"
                    )
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "history maintenance failed"),
            }
        }
    }

    /// One round: read the setting; if on and no other worker is at it,
    /// create partitions ahead and drop expired ones.
    pub async fn run_once(&self) -> Result<MaintenanceReport> {
        // A transaction object: any error rolls back (on drop) before the
        // connection goes back to the pool.
        let mut conn = self
            .pool
            .get()
            .await
            .map_err(Error::pool("history maintenance: no connection"))?;
        let tx = conn
            .transaction()
            .await
            .map_err(Error::db("history maintenance: begin"))?;
        let row = Db::unnamed(tx.client())
            .query_one(&sql::HISTORY_LOCK, &[])
            .await
            .map_err(Error::db("history maintenance"))?;
        let keep = row.get::<_, Option<f64>>(0);
        let locked: bool = row.get(1);
        self.switch.set(keep.is_some());
        let mut report = MaintenanceReport {
            keep: keep.map(Duration::from_secs_f64),
            ..MaintenanceReport::default()
        };
        if let (Some(keep), true) = (keep, locked) {
            let lock_ms = self.config.lock_timeout.as_secs_f64() * 1000.0;
            let row = Db::unnamed(tx.client())
                .query_one(
                    &sql::HISTORY_MAINTAIN,
                    &[&keep, &self.config.partitions_ahead, &lock_ms],
                )
                .await
                .map_err(Error::db("history maintenance"))?;
            report.maintained = true;
            report.created = row.get(0);
            report.dropped = row.get(1);
            report.rows_dropped = row.get(2);
            report.failed = row.get(3);
        }
        tx.commit()
            .await
            .map_err(Error::db("history maintenance: commit"))?;
        report.traces_swept = Db::unnamed(&conn)
            .query_one(&sql::TRACE_SWEEP, &[&TRACE_SWEEP_BATCH])
            .await
            .map_err(Error::db("history maintenance: sweeping trace contexts"))?
            .get(0);
        report.steps_swept = Db::unnamed(&conn)
            .query_one(&sql::STEP_SWEEP, &[&TRACE_SWEEP_BATCH])
            .await
            .map_err(Error::db("history maintenance: sweeping recorded steps"))?
            .get(0);
        if report.dropped > 0 {
            ::metrics::counter!(metrics::HISTORY_PARTITIONS_DROPPED)
                .increment(report.dropped as u64);
        }
        if report.rows_dropped > 0 {
            ::metrics::counter!(metrics::HISTORY_ROWS_DROPPED)
                .increment(report.rows_dropped as u64);
        }
        if !report.failed.is_empty() {
            ::metrics::counter!(metrics::HISTORY_MAINTENANCE_FAILURES)
                .increment(report.failed.len() as u64);
        }
        Ok(report)
    }
}
