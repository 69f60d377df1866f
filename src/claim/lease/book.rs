//! What a worker holds in lease mode: the lease book (every token it holds,
//! running or awaiting its outcome write, and until when each lease is known
//! to hold) and the channel its runs send their resolutions to the
//! completer on.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::claim::outcome::Finished;

/// The leases this worker holds: running jobs and finished ones whose
/// outcome is not written yet.
#[derive(Debug, Default)]
pub(crate) struct LeaseBook {
    inner: Mutex<HashMap<i64, Lease>>,
    /// Woken when an outcome is written (a lease leaves the book).
    removed: Notify,
}

#[derive(Debug)]
struct Lease {
    /// Cancelled when the lease is lost: the run stops.
    lost: CancellationToken,
    /// Until when the lease is known to hold: the send time of the last
    /// statement that set it, plus the lease length (the server's clock
    /// counted from a moment no later than the server's `now()`).
    secured_until: Instant,
    /// Its run is over and its outcome is on its way to the database: once
    /// written, the lease row is gone, which the heartbeat must not take
    /// for a lost lease (the completer's fenced write tells a real loss).
    ended: bool,
}

impl LeaseBook {
    /// Hold `token`, secured until `secured_until`; returns the token that
    /// is cancelled if the lease is lost (a child of `abort`).
    pub(crate) fn insert(
        &self,
        token: i64,
        secured_until: Instant,
        abort: &CancellationToken,
    ) -> CancellationToken {
        let lost = abort.child_token();
        self.inner.lock().expect("lease book").insert(
            token,
            Lease {
                lost: lost.clone(),
                secured_until,
                ended: false,
            },
        );
        lost
    }

    /// The run of `token` is over; its outcome goes to the completer.
    pub(crate) fn ended(&self, token: i64) {
        if let Some(l) = self.inner.lock().expect("lease book").get_mut(&token) {
            l.ended = true;
        }
    }

    /// The outcome of `token` is written (or abandoned).
    pub(crate) fn remove(&self, token: i64) {
        self.inner.lock().expect("lease book").remove(&token);
        self.removed.notify_waiters();
    }

    /// Returns once no run that ended is waiting for its outcome write.
    pub(crate) async fn outcomes_written(&self) {
        loop {
            let removed = self.removed.notified();
            tokio::pin!(removed);
            removed.as_mut().enable();
            if !self
                .inner
                .lock()
                .expect("lease book")
                .values()
                .any(|l| l.ended)
            {
                return;
            }
            removed.await;
        }
    }

    /// Every token held.
    pub(crate) fn tokens(&self) -> Vec<i64> {
        self.inner
            .lock()
            .expect("lease book")
            .keys()
            .copied()
            .collect()
    }

    /// A heartbeat sent at `sent` renewed `renewed` out of `asked` and
    /// found `held` still held but locked (not renewed: they keep the time
    /// they were secured until); the others are lost.
    pub(crate) fn renewed(
        &self,
        asked: &[i64],
        renewed: &[i64],
        held: &[i64],
        sent: Instant,
        lease: Duration,
    ) -> usize {
        let renewed: std::collections::HashSet<i64> = renewed.iter().copied().collect();
        let held: std::collections::HashSet<i64> = held.iter().copied().collect();
        let mut book = self.inner.lock().expect("lease book");
        let mut lost = 0;
        for token in asked {
            let Some(l) = book.get_mut(token) else {
                continue;
            };
            if renewed.contains(token) {
                l.secured_until = sent + lease;
            } else if held.contains(token) || l.ended {
                // An ended run's row may be gone because its outcome was
                // just written (the heartbeat read the book before the
                // completer removed it): not a lost lease.
                continue;
            } else if !l.lost.is_cancelled() {
                l.lost.cancel();
                lost += 1;
            }
        }
        lost
    }

    /// Stop every run whose lease may end within `margin`: it could not be
    /// renewed, and another worker may take the job once it expires.
    pub(crate) fn stop_unsecured(&self, margin: Duration) -> usize {
        let now = Instant::now();
        let book = self.inner.lock().expect("lease book");
        let mut stopped = 0;
        for l in book.values() {
            if l.secured_until <= now + margin && !l.ended && !l.lost.is_cancelled() {
                l.lost.cancel();
                stopped += 1;
            }
        }
        stopped
    }
}

/// How long before a lease could end, unrenewed, its run is stopped.
pub(crate) fn stop_margin(lease: Duration) -> Duration {
    lease / 6
}

/// Where runs send what they finished.
#[derive(Clone)]
pub(crate) struct CompleterHandle {
    tx: mpsc::UnboundedSender<Finished>,
}

impl CompleterHandle {
    pub(crate) fn send(&self, finished: Finished) {
        // The completer outlives every run (the worker joins runs first).
        let _ = self.tx.send(finished);
    }
}

/// A handle and the receiving end for [`run`].
pub(crate) fn channel() -> (CompleterHandle, mpsc::UnboundedReceiver<Finished>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (CompleterHandle { tx }, rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue repro (`pgwake bench`, lease mode, batch 100: "leases lost
    /// (expired and rescued): stopping those runs jobs=12" with nothing
    /// rescued): the heartbeat read the book, the completer wrote an ended
    /// run's outcome (its lease row gone), and the heartbeat's answer,
    /// missing that token, counted it lost before the completer took it out
    /// of the book.
    #[test]
    fn an_ended_run_whose_row_is_gone_is_not_a_lost_lease() {
        let book = LeaseBook::default();
        let abort = CancellationToken::new();
        let lease = Duration::from_secs(30);
        let running = book.insert(1, Instant::now() + lease, &abort);
        let ended = book.insert(2, Instant::now() + lease, &abort);
        book.ended(2);
        let lost = book.renewed(&[1, 2], &[], &[], Instant::now(), lease);
        assert_eq!(lost, 1, "only the running job's lease is lost");
        assert!(running.is_cancelled());
        assert!(!ended.is_cancelled());
    }
}
