//! Liveness and readiness as the worker sees them, shared by its services
//! and served on `/health` and `/ready`.

use std::sync::atomic::{AtomicBool, Ordering};
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
    /// sample, was at least [`HORIZON_HELD`] old (claims then resume after
    /// the last job claimed, `claim/choose/cursor.rs`).
    horizon_held: AtomicBool,
}

/// How old the oldest open transaction must be, at a sample, for the
/// worker's claims to resume after the last job claimed rather than walk
/// the head of the claim index (`claim/choose/cursor.rs`): from then on every job
/// claimed leaves an index entry no claim can skip. Well under the
/// governor's default threshold (a minute), which is for people.
pub(crate) const HORIZON_HELD: std::time::Duration = std::time::Duration::from_secs(5);

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

    /// Record the age of the oldest open transaction of a client session,
    /// as the sampler read it.
    pub fn set_oldest_transaction_age(&self, seconds: f64) {
        self.horizon_held
            .store(seconds >= HORIZON_HELD.as_secs_f64(), Ordering::Relaxed);
    }

    /// Whether claims resume after the last job claimed (`claim/choose/cursor.rs`):
    /// the database under pressure, or a transaction open for
    /// 5 s or more at the last sample.
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
