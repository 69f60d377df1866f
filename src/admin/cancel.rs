//! Cancellation: the admin API ([`cancel`]) and the worker's side of it.
//!
//! ```text
//!  pgwake.cancel(id)  (functions/cancel.sql, one transaction)
//!    waiting (row free)      ──▶ dead_jobs 'cancelled'                      → Cancelled
//!    leased (lease mode)     ──▶ dead_jobs 'cancelled' (token gone: fenced)  ┐
//!    locked by a claim (tx)  ──▶ (stays with its claim)                      ├ → Requested
//!         both: INSERT cancel_requests + NOTIFY pgwake_control 'cancel <id>' ┘
//!    in dead_jobs                                                            → Dead
//!    nowhere, id issued by the jobs' identity sequence                       → Finished
//!    nowhere, never issued                                                   → NotFound
//!
//!  worker: listener ── notification for a job it runs ──▶ poll now ─┐
//!          Watcher  ── every cancel_poll_interval, after each       ├─▶ requests for the ids this
//!                      listener (re)connect, and when prompted ─────┘   worker runs: the run's token
//!                                                                        fires, handler stopped (exec:
//!                                                                        process tree killed),
//!                                                                        Resolution::Cancelled
//!          tx: savepoint rolled back (statement cancelled), job buried 'cancelled' in the claim's commit
//!          lease: bury fenced by token (a no-op when pgwake.cancel already did it)
//! ```
//!
//! The notification is the fast path and only a prompt (anyone who can
//! connect may NOTIFY); the request row is the authority and what cannot be
//! lost: a worker whose listener was away when the NOTIFY went out finds the
//! row on its next poll (River's issue #1358 was a cancel lost exactly so).

use std::time::Duration;

use tokio_postgres::GenericClient;

use crate::error::{Error, Result};

use crate::db::sql::{Db, CANCEL};

/// The NOTIFY channel of cancel requests (payload `cancel <id>`).
pub const CONTROL_CHANNEL: &str = "pgwake_control";

/// How often a worker's watcher removes cancel requests whose job has
/// finished (they can no longer stop anything).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);

/// What [`cancel`] did with a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelOutcome {
    /// It was waiting: it left the queue and is in `pgwake.dead_jobs` with
    /// `last_error = 'cancelled'`.
    Cancelled,
    /// It is running: the worker running it stops it and records it as
    /// cancelled (a lease-mode job is recorded at once).
    Requested,
    /// It is already in `pgwake.dead_jobs`; nothing changed.
    Dead,
    /// It existed and has finished (or was purged from `dead_jobs`):
    /// nothing changed.
    Finished,
    /// No job ever had this id; nothing changed.
    NotFound,
}

impl CancelOutcome {
    /// The value `pgwake.cancel()` returns for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            CancelOutcome::Cancelled => "cancelled",
            CancelOutcome::Requested => "cancel_requested",
            CancelOutcome::Dead => "dead",
            CancelOutcome::Finished => "finished",
            CancelOutcome::NotFound => "not_found",
        }
    }

    /// Whether the job is (or will be) cancelled by this call.
    pub fn is_cancelled(&self) -> bool {
        matches!(self, CancelOutcome::Cancelled | CancelOutcome::Requested)
    }

    fn parse(s: &str) -> Result<CancelOutcome> {
        Ok(match s {
            "cancelled" => CancelOutcome::Cancelled,
            "cancel_requested" => CancelOutcome::Requested,
            "dead" => CancelOutcome::Dead,
            "finished" => CancelOutcome::Finished,
            "not_found" => CancelOutcome::NotFound,
            _ => return Err(Error::Unexpected(
                "pgwake.cancel() returned an unknown value (is the schema newer than this pgwake?)",
            )),
        })
    }
}

/// Cancel job `id` (`SELECT pgwake.cancel(id)`): a waiting job leaves the
/// queue at once, a running one is stopped by the worker that runs it. Both
/// end in `pgwake.dead_jobs` with `last_error = 'cancelled'`, from where
/// [`crate::admin::dead::retry`] brings them back. Run inside the caller's
/// transaction if `db` is one.
pub async fn cancel<C: GenericClient>(db: &C, id: i64) -> Result<CancelOutcome> {
    let row = Db::unnamed(db.client())
        .query_one(&CANCEL, &[&id])
        .await
        .map_err(Error::db("cannot cancel the job"))?;
    CancelOutcome::parse(row.get::<_, &str>(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_the_sql_values() {
        for o in [
            CancelOutcome::Cancelled,
            CancelOutcome::Requested,
            CancelOutcome::Dead,
            CancelOutcome::Finished,
            CancelOutcome::NotFound,
        ] {
            assert_eq!(CancelOutcome::parse(o.as_str()).unwrap(), o);
        }
        assert!(CancelOutcome::parse("maybe").is_err());
    }
}
