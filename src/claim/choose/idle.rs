//! Whether the claim tasks are idle or draining, as they report it: the
//! waiting registration (`services/waiting.rs`) registers the worker for a
//! NOTIFY only when some task is idle and no claim found jobs within
//! [`LINGER`].

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long after the last claim that found jobs the worker still counts as
/// draining (not registered). Short enough that a truly idle worker is
/// registered almost at once; long enough that a steady stream of jobs never
/// makes it register.
pub const LINGER: Duration = Duration::from_millis(5);

/// What the claim tasks report to the registration service.
#[derive(Debug)]
pub(crate) struct WaitState {
    started: Instant,
    pub(crate) idle: AtomicUsize,
    /// Claims in flight that continue a drain ([`WaitState::draining_claim`]).
    claiming: AtomicUsize,
    /// Milliseconds since `started` of the last claim that found jobs.
    last_hit_ms: AtomicU64,
    pub(crate) changed: Notify,
}

impl Default for WaitState {
    fn default() -> Self {
        WaitState {
            started: Instant::now(),
            idle: AtomicUsize::new(0),
            claiming: AtomicUsize::new(0),
            last_hit_ms: AtomicU64::new(0),
            changed: Notify::new(),
        }
    }
}

impl WaitState {
    /// A claim task starts waiting for a wake-up.
    pub(crate) fn enter_idle(&self) {
        if self.idle.fetch_add(1, Ordering::SeqCst) == 0 {
            self.changed.notify_one();
        }
    }

    /// A claim task woke up.
    pub(crate) fn leave_idle(&self) {
        self.idle.fetch_sub(1, Ordering::SeqCst);
    }

    /// A claim found jobs.
    pub(crate) fn hit(&self) {
        let now = self.started.elapsed().as_millis() as u64 + 1;
        if self.last_hit_ms.swap(now, Ordering::SeqCst) + LINGER.as_millis() as u64 <= now {
            self.changed.notify_one();
        }
    }

    /// A claim that continues a drain (the one before found jobs) is in
    /// flight: the worker counts as draining until it ends. Few lease
    /// claims are in flight at a time (claimer.rs, `LeaseTurn`; one with
    /// the defaults), and on a loaded server one can take longer than
    /// [`LINGER`]: between its hits the worker registered, re-checked with a
    /// wake-up and unregistered again.
    pub(crate) fn draining_claim(&self) -> DrainingClaim<'_> {
        self.claiming.fetch_add(1, Ordering::SeqCst);
        DrainingClaim(self)
    }

    /// Time left until the worker no longer counts as draining.
    pub(crate) fn draining_for(&self) -> Option<Duration> {
        if self.claiming.load(Ordering::SeqCst) > 0 {
            return Some(LINGER);
        }
        let last = self.last_hit_ms.load(Ordering::SeqCst);
        if last == 0 {
            return None;
        }
        let until = Duration::from_millis(last) + LINGER;
        until
            .checked_sub(self.started.elapsed())
            .filter(|d| !d.is_zero())
    }
}

/// Ends a [`WaitState::draining_claim`] when dropped; the claim's hit, if
/// any, counts from then.
pub(crate) struct DrainingClaim<'a>(&'a WaitState);

impl Drop for DrainingClaim<'_> {
    fn drop(&mut self) {
        self.0.claiming.fetch_sub(1, Ordering::SeqCst);
    }
}
