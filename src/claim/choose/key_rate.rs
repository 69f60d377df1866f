//! Rate limits per limit key (migration 0021): at most N jobs of any one
//! limit key of a queue are admitted in any window W (sliding), across
//! every worker. The queue rate's admission clock ([`crate::claim::choose::rate`]),
//! kept per key.
//!
//! ```text
//!  claim round, queue Q with a per-key rate:
//!    key_rate_reserve.sql (autocommit) ── pgwake.reserve_key_admissions:
//!        │   keys of Q's ready jobs in this worker's rotation (after its
//!        │   last key), one admission per key per pass, stamped now(),
//!        │   passing over at most pgwake.key_walk_bound() keys (the
//!        │   rotation resumes after the last it visited)
//!        ├─ a key with ready jobs and no free slot: hint the poller at its
//!        │  next free admission (KEY_RATE_THROTTLED)
//!        ▼
//!    claim_*_limited.sql with $admitted_keys: pgwake.fair_key_jobs takes at
//!        │   most as many jobs of a key as it was admitted (keyless jobs: none
//!        ▼   needed)
//!    key_rate_release.sql ── give back, per key, the admissions not used
//! ```
//!
//! Admissions are committed before the claim, never inside a tx-mode claim
//! transaction (a rollback after a crash would forget runs whose handlers
//! already called out). A keyed run's admission time is
//! [`crate::JobContext::admitted_at`].

use std::collections::HashMap;
use std::time::SystemTime;

use crate::claim::choose::rate::Ledger;
use crate::db::connect::PooledConn;
use crate::db::sql::{Db, KEY_RATE_RELEASE, KEY_RATE_RESERVE};
use crate::error::{Error, Result};

/// Per-key admissions taken for one claim.
#[derive(Debug)]
pub(crate) struct KeyAdmission {
    /// The queue (as the database named it; `None`: a suspect's job that
    /// was gone).
    queue: Option<String>,
    /// Whether the queue has a per-key rate at all.
    rated: bool,
    /// The keys admitted, one entry per admission, pairwise with `slots`.
    keys: Vec<String>,
    /// The slots taken.
    slots: Vec<i32>,
    /// Their admission time (database clock).
    pub admitted_at: SystemTime,
    /// The key where the reservation's walk stopped at the bound of keys
    /// passed over (`pgwake.key_walk_bound()`): the rotation resumes after
    /// it.
    pub stop: Option<String>,
}

impl KeyAdmission {
    /// The keys admitted, one entry per admission, for the claim (`None`:
    /// the queue has no per-key rate).
    pub(crate) fn keys(&self) -> Option<&[String]> {
        self.rated.then_some(&self.keys[..])
    }

    /// Whether at least one admission was taken.
    pub(crate) fn any(&self) -> bool {
        !self.keys.is_empty()
    }

    /// When the admitted runs were admitted, if the queue has a per-key rate.
    pub(crate) fn admitted(&self) -> Option<SystemTime> {
        self.rated.then_some(self.admitted_at)
    }

    /// The admissions a claim that took jobs of `used` keys (`None`: a job
    /// without a key) did not use, pairwise (keys, slots).
    fn unused<'k>(&self, used: impl Iterator<Item = Option<&'k str>>) -> (Vec<&str>, Vec<i32>) {
        let mut taken: HashMap<&str, usize> = HashMap::new();
        for k in used.flatten() {
            *taken.entry(k).or_default() += 1;
        }
        let mut keys = Vec::new();
        let mut slots = Vec::new();
        for (k, s) in self.keys.iter().zip(&self.slots) {
            match taken.get_mut(k.as_str()) {
                Some(n) if *n > 0 => *n -= 1,
                _ => {
                    keys.push(k.as_str());
                    slots.push(*s);
                }
            }
        }
        (keys, slots)
    }
}

/// What a reservation is for.
pub(crate) struct Wanted<'a> {
    /// The queue (ignored with `job`: that job's queue).
    pub queue: &'a str,
    /// The last key this worker served of the queue.
    pub after: Option<&'a str>,
    /// Most admissions.
    pub count: i64,
    /// Only these tasks (`None`: any).
    pub tasks_in: &'a Option<Vec<String>>,
    /// Never these tasks.
    pub tasks_not_in: &'a [String],
    /// The one job of a suspect's claim.
    pub job: Option<i64>,
}

/// Take per-key admissions, on a connection of the ledger pool (they
/// commit before the claim). A key whose ready jobs found no free admission
/// hints the poller at its next one, so the backlog starts on time without
/// a notification.
pub(crate) async fn reserve(ledger: Ledger<'_>, w: Wanted<'_>) -> Result<KeyAdmission> {
    let mut conn = PooledConn::get(ledger.pool, "claim: no connection for admissions").await?;
    let r = Db::pooled(&conn, ledger.prepared)
        .query_one(
            &KEY_RATE_RESERVE,
            &[
                &w.queue,
                &w.after,
                &w.count,
                w.tasks_in,
                &w.tasks_not_in,
                &w.job,
            ],
        )
        .await;
    let row = conn
        .check(r)
        .map_err(Error::db("claim: per-key rate admissions"))?;
    let admission = KeyAdmission {
        queue: row.get(0),
        rated: row.get(1),
        keys: row.get(2),
        slots: row.get(3),
        admitted_at: row.get(4),
        stop: row.get(6),
    };
    let next_free: Option<SystemTime> = row.get(5);
    if let (Some(at), Some(q)) = (next_free, &admission.queue) {
        ledger.schedule.hint(at);
        ::metrics::counter!(crate::metrics::KEY_RATE_THROTTLED, "queue" => crate::metrics::queue_label(q))
            .increment(1);
    }
    Ok(admission)
}

/// The claim took jobs of `used` keys: give back the admissions it did not
/// use, on a connection of the ledger pool.
pub(crate) async fn settle<'k>(
    ledger: Ledger<'_>,
    admission: Option<&KeyAdmission>,
    used: impl Iterator<Item = Option<&'k str>>,
) -> Result<()> {
    let Some((admission, queue)) = admission.and_then(|a| Some((a, a.queue.as_ref()?))) else {
        return Ok(());
    };
    let (keys, slots) = admission.unused(used);
    if keys.is_empty() {
        return Ok(());
    }
    let mut conn = PooledConn::get(ledger.pool, "claim: no connection for admissions").await?;
    let r = Db::pooled(&conn, ledger.prepared)
        .execute(
            &KEY_RATE_RELEASE,
            &[queue, &keys, &slots, &admission.admitted_at],
        )
        .await;
    conn.check(r)
        .map_err(Error::db("claim: give back per-key rate admissions"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unused_admissions_are_those_beyond_each_keys_jobs() {
        let a = KeyAdmission {
            queue: Some("q".into()),
            rated: true,
            keys: vec!["a".into(), "b".into(), "a".into(), "c".into()],
            slots: vec![1, 1, 2, 1],
            admitted_at: SystemTime::UNIX_EPOCH,
            stop: None,
        };
        let (keys, slots) = a.unused([Some("a"), None, Some("c")].into_iter());
        assert_eq!(keys, vec!["b", "a"]);
        assert_eq!(slots, vec![1, 2]);
    }
}
