//! The runs a worker can stop on a cancel ([`CancelBook`]), by job id: each
//! run registers a [`Watch`] whose token fires on a cancel. The listener
//! and the watcher service (`services/cancel_watcher.rs`) call into it;
//! what a cancel does to each kind of job is in `admin/cancel.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The runs this worker can stop on a cancel, by job id.
#[derive(Debug, Default)]
pub(crate) struct CancelBook {
    running: Mutex<HashMap<i64, Entry>>,
    /// Ask the watcher to poll now (the listener (re)connected: whatever was
    /// notified while it was away is lost).
    pub(crate) poll_now: Notify,
    /// A cancel reached a job of this worker: one still in the prefetch
    /// buffer ends at once (`lease::bury_cancelled`); or a queue became
    /// paused or limited: its buffered jobs go back.
    pub(crate) cancelled_some: Notify,
    /// Queues that became paused or limited (control notification
    /// `queue <name>`), with when the worker heard of it.
    restricted: Mutex<HashMap<String, Instant>>,
}

/// How long a queue's restriction is remembered: longer than any claim in
/// flight when it came (a claim sent before it lands after it).
const RESTRICTED_KEPT: Duration = Duration::from_secs(60);

/// Most restricted queues remembered (a flood of forged notifications
/// cannot grow the map without bound).
const RESTRICTED_MAX: usize = 10_000;

#[derive(Debug)]
struct Entry {
    stop: CancellationToken,
    cancelled: Arc<AtomicBool>,
}

/// A run registered in the [`CancelBook`]; unregistered when dropped.
pub(crate) struct Watch {
    book: Arc<CancelBook>,
    id: i64,
    token: CancellationToken,
    cancelled: Arc<AtomicBool>,
}

impl Watch {
    /// Fires when the run must stop: a cancel, or `parent`.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Whether a cancel request for this job reached the worker.
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut running = self.book.running.lock().expect("cancel book");
        if running
            .get(&self.id)
            .is_some_and(|e| Arc::ptr_eq(&e.cancelled, &self.cancelled))
        {
            running.remove(&self.id);
        }
    }
}

impl CancelBook {
    /// Register a run of job `id`; its token is a child of `parent`.
    pub(crate) fn watch(self: &Arc<Self>, id: i64, parent: &CancellationToken) -> Watch {
        let token = parent.child_token();
        let cancelled = Arc::new(AtomicBool::new(false));
        self.running.lock().expect("cancel book").insert(
            id,
            Entry {
                stop: token.clone(),
                cancelled: cancelled.clone(),
            },
        );
        Watch {
            book: self.clone(),
            id,
            token,
            cancelled,
        }
    }

    /// Stop the run of job `id` if this worker has one; returns whether it
    /// had.
    pub(crate) fn cancel(&self, id: i64) -> bool {
        let running = self.running.lock().expect("cancel book");
        let Some(e) = running.get(&id) else {
            return false;
        };
        if !e.cancelled.swap(true, Ordering::AcqRel) {
            tracing::info!(job = id, "cancel request received: stopping the job");
            self.cancelled_some.notify_one();
        }
        e.stop.cancel();
        true
    }

    /// A control notification's payload (`cancel <id>`). A notification is
    /// a hint, never an authority: any role that can connect may NOTIFY, so
    /// for a job this worker runs it only makes the watcher read
    /// `pgwake.cancel_requests` at once (a row only a role with the
    /// worker's grant can write); the request row decides.
    pub(crate) fn on_notification(&self, payload: &str) {
        if let Some(queue) = payload.strip_prefix("queue ") {
            self.restrict(queue, Instant::now());
            return;
        }
        match payload
            .strip_prefix("cancel ")
            .and_then(|id| id.parse::<i64>().ok())
        {
            Some(id) => {
                if self.running.lock().expect("cancel book").contains_key(&id) {
                    self.poll_soon();
                }
            }
            None => tracing::debug!(payload, "ignoring an unknown control notification"),
        }
    }

    /// `queue` became paused or limited at `at`: its buffered jobs go back
    /// (`lease::bury_cancelled` is woken for them).
    pub(crate) fn restrict(&self, queue: &str, at: Instant) {
        {
            let mut restricted = self.restricted.lock().expect("cancel book");
            restricted.retain(|_, t| at.saturating_duration_since(*t) < RESTRICTED_KEPT);
            if restricted.len() < RESTRICTED_MAX || restricted.contains_key(queue) {
                restricted.insert(queue.to_string(), at);
            }
        }
        self.cancelled_some.notify_one();
    }

    /// Whether `queue` became paused or limited after `since`: a job of it
    /// claimed then must not wait in the buffer.
    pub(crate) fn restricted_since(&self, queue: &str, since: Instant) -> bool {
        self.restricted
            .lock()
            .expect("cancel book")
            .get(queue)
            .is_some_and(|t| *t >= since)
    }

    /// Ask the watcher to poll at once.
    pub(crate) fn poll_soon(&self) {
        self.poll_now.notify_one();
    }

    pub(crate) fn ids(&self) -> Vec<i64> {
        self.running
            .lock()
            .expect("cancel book")
            .keys()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cancel_stops_only_the_watched_run_and_says_so() {
        let book = Arc::new(CancelBook::default());
        let parent = CancellationToken::new();
        let a = book.watch(1, &parent);
        let b = book.watch(2, &parent);
        book.on_notification("cancel 1");
        book.on_notification("cancel x");
        assert!(
            !a.token().is_cancelled(),
            "a notification alone stops nothing"
        );
        assert!(book.cancel(1));
        assert!(a.token().is_cancelled() && a.cancelled());
        assert!(!b.token().is_cancelled() && !b.cancelled());
        drop(a);
        assert!(!book.cancel(1), "an ended run is no longer in the book");
        parent.cancel();
        assert!(b.token().is_cancelled() && !b.cancelled());
    }
}
