//! Liveness and readiness as the worker sees them, shared by its services
//! and served on `/health` and `/ready`.

use std::sync::atomic::{AtomicBool, Ordering};

/// Readiness inputs. Ready = the database answers and, unless the worker
/// runs with `--no-listen`, the listener is connected.
#[derive(Debug)]
pub struct Health {
    db_ok: AtomicBool,
    listener_ok: AtomicBool,
    listen: AtomicBool,
}

impl Health {
    /// New state; `listen` says whether the listener counts.
    pub fn new(listen: bool) -> Health {
        Health {
            db_ok: AtomicBool::new(false),
            listener_ok: AtomicBool::new(false),
            listen: AtomicBool::new(listen),
        }
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
        self.db_ok() && (!self.listen.load(Ordering::Relaxed) || self.listener_ok())
    }

    fn publish(&self) {
        metrics::gauge!(crate::metrics::READY).set(if self.ready() { 1.0 } else { 0.0 });
    }
}
