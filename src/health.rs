//! Liveness and readiness as the worker sees them, shared by its services
//! and served on `/health` and `/ready`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Readiness inputs. Ready = the database answers, its schema is this
/// binary's and, unless the worker runs with `--no-listen`, the listener is
/// connected.
#[derive(Debug)]
pub struct Health {
    db_ok: AtomicBool,
    listener_ok: AtomicBool,
    listen: AtomicBool,
    /// What the worker waits for in the schema at start (`None`: nothing).
    schema_pending: Mutex<Option<String>>,
    /// Whether the governor's level, as the sampler last read it, is above
    /// ok (tx-mode batches are then capped, see `claim/tx/sizer.rs`).
    under_pressure: AtomicBool,
    /// Whether the oldest open transaction of a client session, at the last
    /// sample, held the horizon long enough for claims to resume after the
    /// last job claimed (`horizon_held`, `claim/choose/cursor.rs`).
    horizon_held: AtomicBool,
    /// Jobs this worker has claimed since it started (the sampler's claim
    /// rate, `horizon_held`).
    claimed: AtomicU64,
}

/// How old the oldest open transaction must be, at a sample, for the
/// worker's claims to resume after the last job claimed rather than walk
/// the head of the claim index (`claim/choose/cursor.rs`): from then on every job
/// claimed leaves an index entry no claim can skip. Well under the
/// governor's default threshold (a minute), which is for people.
pub(crate) const HORIZON_HELD: std::time::Duration = std::time::Duration::from_secs(5);

/// The youngest transaction that turns the claims' cursor on
/// (`horizon_held`), however fast the worker claims: a transaction of an
/// ordinary request is younger.
pub(crate) const HORIZON_HELD_MIN: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a transaction open `age` seconds holds the vacuum horizon long
/// enough for this worker's claims to resume after the last job claimed
/// (`claim/choose/cursor.rs`): [`HORIZON_HELD`] (5 s), or sooner, from
/// [`HORIZON_HELD_MIN`] (1 s), once the jobs this worker has claimed since
/// the transaction began — `age` times its claim rate, `claims_per_second`
/// — reach `held_claims` (`WorkerConfig::horizon_held_claims`). Each of
/// those jobs left an index entry that every claim from the head walks
/// while the transaction lasts, so the cost of the claims grows with the
/// rate as well as the time: at 1,500 jobs/s the 5–6 s before the cursor
/// took over left up to 9,000 such entries for each claim to walk
/// (docs/src/performance.md, "The first seconds of a pin").
pub(crate) fn horizon_held(age: f64, claims_per_second: f64, held_claims: u64) -> bool {
    age >= HORIZON_HELD.as_secs_f64()
        || (age >= HORIZON_HELD_MIN.as_secs_f64() && age * claims_per_second >= held_claims as f64)
}

impl Health {
    /// New state; `listen` says whether the listener counts.
    pub fn new(listen: bool) -> Health {
        Health {
            db_ok: AtomicBool::new(false),
            listener_ok: AtomicBool::new(false),
            listen: AtomicBool::new(listen),
            schema_pending: Mutex::new(None),
            under_pressure: AtomicBool::new(false),
            horizon_held: AtomicBool::new(false),
            claimed: AtomicU64::new(0),
        }
    }

    /// Record whether the database is under pressure (the governor's level,
    /// `pgwake.pressure()`, above ok), as the sampler last read it.
    pub fn set_under_pressure(&self, under: bool) {
        self.under_pressure.store(under, Ordering::Relaxed);
    }

    /// Whether the database was under pressure at the last sample: the
    /// worker then caps its tx-mode batches, so that its own claim
    /// transactions hold the horizon and their rows for less.
    pub fn under_pressure(&self) -> bool {
        self.under_pressure.load(Ordering::Relaxed)
    }

    /// Record whether the oldest open transaction of a client session, as
    /// the sampler last read it, holds the horizon long enough for claims
    /// to resume after the last job claimed (the sampler decides, from the
    /// transaction's age and this worker's claim rate).
    pub fn set_horizon_held(&self, held: bool) {
        self.horizon_held.store(held, Ordering::Relaxed);
    }

    /// Whether the oldest open transaction held the horizon long enough at
    /// the last reading ([`Health::set_horizon_held`]).
    pub fn horizon_held(&self) -> bool {
        self.horizon_held.load(Ordering::Relaxed)
    }

    /// Count `n` jobs this worker claimed.
    pub fn count_claimed(&self, n: usize) {
        self.claimed.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Jobs this worker has claimed since it started.
    pub fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }

    /// Whether claims resume after the last job claimed (`claim/choose/cursor.rs`):
    /// the database under pressure, or a transaction open long enough at
    /// the last reading (`horizon_held`: 5 s, or from 1 s once this worker
    /// claimed `WorkerConfig::horizon_held_claims` jobs meanwhile).
    pub fn claims_resume(&self) -> bool {
        self.under_pressure() || self.horizon_held.load(Ordering::Relaxed)
    }

    /// Record what the worker waits for in the schema (`Some`: why it is
    /// not ready, e.g. an older version until `pgwake migrate` has run), or
    /// that it waits for nothing (`None`).
    pub fn set_schema_pending(&self, why: Option<String>) {
        *self
            .schema_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = why;
        self.publish();
    }

    /// What the worker waits for in the schema, if anything.
    pub fn schema_pending(&self) -> Option<String> {
        self.schema_pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Say whether the listener counts after all (the worker turns LISTEN
    /// off when it finds it cannot work, e.g. through a transaction-mode
    /// pooler).
    pub fn set_listen(&self, listen: bool) {
        self.listen.store(listen, Ordering::Relaxed);
        self.publish();
    }

    /// Record whether the last database round trip worked.
    pub fn set_db(&self, ok: bool) {
        if self.db_ok.swap(ok, Ordering::Relaxed) != ok {
            self.publish();
        }
    }

    /// Record whether LISTEN is up.
    pub fn set_listener(&self, ok: bool) {
        self.listener_ok.store(ok, Ordering::Relaxed);
        metrics::gauge!(crate::metrics::LISTENER_CONNECTED).set(if ok { 1.0 } else { 0.0 });
        self.publish();
    }

    /// Whether the database answered last time.
    pub fn db_ok(&self) -> bool {
        self.db_ok.load(Ordering::Relaxed)
    }

    /// Whether LISTEN is up.
    pub fn listener_ok(&self) -> bool {
        self.listener_ok.load(Ordering::Relaxed)
    }

    /// Whether the worker can do its job now.
    pub fn ready(&self) -> bool {
        self.db_ok()
            && self.schema_pending().is_none()
            && (!self.listen.load(Ordering::Relaxed) || self.listener_ok())
    }

    fn publish(&self) {
        metrics::gauge!(crate::metrics::READY).set(if self.ready() { 1.0 } else { 0.0 });
    }
}

#[cfg(test)]
mod tests {
    use super::horizon_held;

    #[test]
    fn a_transaction_holds_the_horizon_at_five_seconds_or_sooner_at_a_high_claim_rate() {
        // Without claims, 5 s.
        assert!(!horizon_held(4.9, 0.0, 2_000));
        assert!(horizon_held(5.0, 0.0, 2_000));
        // At 1,500 claims/s, from 2,000 entries: 1.34 s; from 500: 1 s.
        assert!(!horizon_held(1.3, 1_500.0, 2_000));
        assert!(horizon_held(1.4, 1_500.0, 2_000));
        assert!(horizon_held(1.0, 1_500.0, 500));
        // Never before 1 s, however fast.
        assert!(!horizon_held(0.9, 1e9, 2_000));
        assert!(horizon_held(1.0, 1e9, 2_000));
        // A low rate waits for the 5 s.
        assert!(!horizon_held(4.0, 100.0, 2_000));
        // 0 entries: from 1 s.
        assert!(horizon_held(1.0, 0.0, 0));
    }
}
