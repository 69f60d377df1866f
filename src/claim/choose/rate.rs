//! Rate limits per queue (migration 0010): at most N jobs of a queue are
//! admitted in any window W (sliding), across every worker.
//!
//! ```text
//!  claim round, queue Q rate-limited:
//!    rate_reserve.sql (autocommit) ── up to `limit` slots whose last admission
//!        │                            is ≥ W old, stamped now(): admitted
//!        ├─ none free: skip Q; hint the poller at the next free slot
//!        ▼
//!    claim_*_limited.sql with $cap = admissions taken
//!        ▼
//!    rate_release.sql ── give back the admissions the claim did not use
//! ```
//!
//! Admissions are committed before the claim (tx mode cannot take them in
//! its claim transaction: a rollback after a crash would forget runs whose
//! handlers already called out, and the slot rows would stay locked for as
//! long as the jobs run). A run's admission time is
//! [`crate::JobContext::admitted_at`].

use std::time::SystemTime;

use crate::claim::choose::next_due::Schedule;
use crate::claim::choose::plan::Target;
use crate::config::PreparedStatements;
use crate::db::connect::PooledConn;
use crate::db::sql::{Db, RATE_RELEASE, RATE_RESERVE};
use crate::error::{Error, Result};

/// Where admissions (per queue here, per key in `key_rate.rs`) are taken
/// and given back: the ledger pool, on which they commit outside any claim
/// transaction, how statements go over it, and the schedule the poller
/// reads, told when a throttled queue or key frees.
#[derive(Clone, Copy)]
pub(crate) struct Ledger<'a> {
    pub pool: &'a deadpool_postgres::Pool,
    pub prepared: PreparedStatements,
    pub schedule: &'a Schedule,
}

/// Admissions taken for one claim.
#[derive(Debug)]
pub(crate) struct Admission {
    /// The queue (as the database named it).
    queue: Option<String>,
    /// Whether the queue has a rate limit at all.
    limited: bool,
    /// The slots taken.
    slots: Vec<i32>,
    /// Their admission time (database clock).
    pub admitted_at: SystemTime,
}

impl Admission {
    /// How many jobs the claim may take (`None`: no rate limit).
    pub(crate) fn cap(&self) -> Option<i64> {
        self.limited.then_some(self.slots.len() as i64)
    }

    /// The claim can take nothing: skip its statement.
    pub(crate) fn none(&self) -> bool {
        self.limited && self.slots.is_empty()
    }

    /// When the admitted runs were admitted, if the queue is rate-limited.
    pub(crate) fn admitted(&self) -> Option<SystemTime> {
        self.limited.then_some(self.admitted_at)
    }
}

/// Take up to `wanted` admissions for `queue` (or, with `job`, for that
/// job's queue). When fewer were free than jobs are ready, the poller is
/// told when the next one frees, so the backlog starts on time without a
/// notification.
pub(crate) async fn reserve(
    schedule: &Schedule,
    db: Db<'_>,
    queue: Option<&str>,
    job: Option<i64>,
    wanted: i64,
) -> std::result::Result<Admission, tokio_postgres::Error> {
    let row = db
        .query_one(&RATE_RESERVE, &[&queue, &wanted, &job])
        .await?;
    let admission = Admission {
        queue: row.get(0),
        limited: row.get(1),
        slots: row.get(2),
        admitted_at: row.get(3),
    };
    let next_free: Option<SystemTime> = row.get(5);
    if let Some(at) = next_free {
        schedule.hint(at);
        if let Some(q) = &admission.queue {
            ::metrics::counter!(crate::metrics::RATE_THROTTLED, "queue" => crate::metrics::queue_label(q))
                .increment(1);
        }
    }
    Ok(admission)
}

/// The claim took `used` jobs: give back the admissions it did not use.
pub(crate) async fn release(
    db: Db<'_>,
    admission: &Admission,
    used: usize,
) -> std::result::Result<(), tokio_postgres::Error> {
    let (Some(queue), true) = (&admission.queue, admission.slots.len() > used) else {
        return Ok(());
    };
    let unused = &admission.slots[used..];
    db.execute(&RATE_RELEASE, &[queue, &unused, &admission.admitted_at])
        .await?;
    Ok(())
}

/// Admissions for a claim of `target` (`None` unless it is rate-limited),
/// taken on a connection of their own: they commit before the claim.
pub(crate) async fn reserve_for(
    ledger: Ledger<'_>,
    target: &Target,
    wanted: i64,
) -> Result<Option<Admission>> {
    let Target::Rated(queue, rates) = target else {
        return Ok(None);
    };
    if !rates.queue {
        return Ok(None);
    }
    reserve_on_own(ledger, Some(queue), None, wanted)
        .await
        .map(Some)
}

/// [`reserve`] on a connection of the ledger pool.
pub(crate) async fn reserve_on_own(
    ledger: Ledger<'_>,
    queue: Option<&str>,
    job: Option<i64>,
    wanted: i64,
) -> Result<Admission> {
    let mut conn = PooledConn::get(ledger.pool, "claim: no connection for admissions").await?;
    let r = reserve(
        ledger.schedule,
        Db::pooled(&conn, ledger.prepared),
        queue,
        job,
        wanted,
    )
    .await;
    conn.check(r).map_err(Error::db("claim: rate admissions"))
}

/// [`release`] on a connection of the ledger pool, if anything is unused.
pub(crate) async fn settle(
    ledger: Ledger<'_>,
    admission: Option<&Admission>,
    used: usize,
) -> Result<()> {
    let Some(admission) = admission.filter(|a| a.slots.len() > used) else {
        return Ok(());
    };
    let mut conn = PooledConn::get(ledger.pool, "claim: no connection for admissions").await?;
    let r = release(Db::pooled(&conn, ledger.prepared), admission, used).await;
    conn.check(r)
        .map_err(Error::db("claim: give back rate admissions"))
}
