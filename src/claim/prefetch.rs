//! Lease-mode prefetch: jobs claimed ahead of the free slots wait here, so a
//! slot freed by a finished job starts the next one without a round trip.
//!
//! ```text
//!  lease claim ── free slots' jobs ──▶ run (lease::spawn_run)
//!       │            the rest ──▶ buffer ──▶ a finishing run takes the next
//!       ▲                            │         (same slot, no round trip)
//!       └── refill: below half ──────┘
//!  shutdown: every buffered job handed back at once (attempt refunded,
//!            one requeue statement through the completer, fenced by token)
//! ```
//!
//! A buffered job is leased like a running one: its token is in the lease
//! book from claim time (the heartbeat renews it) and its id in the cancel
//! book (a cancel requested while it waits is seen when it would start).
//! When it starts, it starts only if its lease still holds (a lost lease:
//! dropped, never run) and no cancel came (buried as cancelled, never run);
//! its timeout counts from then. Limited and rate-limited queues are never
//! prefetched (lease.rs): a buffered job would hold a running slot or an
//! admission it does not use.
//!
//! On a crash (`kill -9`) the buffered jobs were charged an attempt at
//! claim, like running ones: the rescuer cannot tell them apart without a
//! round trip per start. The charge is bounded by the buffer size per
//! worker; a poison job still uses up its attempts and ends dead.

use std::collections::VecDeque;
use std::sync::Mutex;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::claim::cancels::Watch;
use crate::claim::claimed::Claimed;

/// A leased job, claimed, not started yet.
pub(crate) struct Leased {
    pub claimed: Claimed,
    /// Cancelled when its lease is lost.
    pub lost: CancellationToken,
    /// Its entry in the cancel book, from claim time.
    pub watch: Watch,
}

/// The buffer of claimed, unstarted lease-mode jobs.
pub(crate) struct Prefetch {
    jobs: Mutex<VecDeque<Leased>>,
    /// Most jobs buffered; 0: prefetch is off.
    cap: usize,
    /// A refill is wanted (the buffer dropped below half): a claim task
    /// waiting for a free slot claims for the buffer instead.
    pub(crate) refill: Notify,
}

impl Prefetch {
    /// A buffer of at most `cap` jobs (0: off).
    pub(crate) fn new(cap: usize) -> Prefetch {
        Prefetch {
            jobs: Mutex::new(VecDeque::new()),
            cap,
            refill: Notify::new(),
        }
    }

    /// How many more jobs a claim may take for the buffer.
    pub(crate) fn room(&self) -> usize {
        self.cap.saturating_sub(self.len())
    }

    /// Jobs buffered.
    pub(crate) fn len(&self) -> usize {
        self.jobs.lock().expect("prefetch buffer").len()
    }

    /// Buffer a claimed job.
    pub(crate) fn push(&self, job: Leased) {
        self.jobs.lock().expect("prefetch buffer").push_back(job);
    }

    /// The next job to start, in claim order. Asks for a refill when the
    /// buffer is down to half (so it never runs dry under a steady load);
    /// the caller then wakes a claim task, which may be idle.
    pub(crate) fn pop(&self) -> Option<(Leased, bool)> {
        let (job, left) = {
            let mut jobs = self.jobs.lock().expect("prefetch buffer");
            (jobs.pop_front(), jobs.len())
        };
        let job = job?;
        let refill = left * 2 <= self.cap;
        if refill {
            self.refill.notify_one();
        }
        Some((job, refill))
    }

    /// The buffered jobs whose cancel came, out of the buffer.
    pub(crate) fn take_cancelled(&self) -> Vec<Leased> {
        let mut jobs = self.jobs.lock().expect("prefetch buffer");
        let (cancelled, kept): (Vec<Leased>, Vec<Leased>) = std::mem::take(&mut *jobs)
            .into_iter()
            .partition(|j| j.watch.cancelled());
        *jobs = kept.into();
        cancelled
    }

    /// Every buffered job, emptying the buffer (shutdown: they go back).
    pub(crate) fn drain(&self) -> Vec<Leased> {
        self.jobs
            .lock()
            .expect("prefetch buffer")
            .drain(..)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Prefetch;

    #[test]
    fn an_empty_or_off_buffer_has_the_room_of_its_cap() {
        assert_eq!(Prefetch::new(0).room(), 0);
        assert_eq!(Prefetch::new(8).room(), 8);
        assert!(Prefetch::new(8).pop().is_none());
        assert!(Prefetch::new(8).drain().is_empty());
    }
}
