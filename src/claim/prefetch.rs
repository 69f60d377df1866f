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
use std::sync::{Mutex, MutexGuard};

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
    state: Mutex<State>,
    /// Most jobs buffered; 0: prefetch is off.
    cap: usize,
    /// A refill is wanted (the buffer dropped below half): a claim task
    /// waiting for a free slot claims for the buffer instead.
    pub(crate) refill: Notify,
}

/// The buffer and the claims in flight for it, under one lock: a claim
/// reserves its room and the next sees it taken.
#[derive(Default)]
struct State {
    jobs: VecDeque<Leased>,
    /// Jobs asked for by the buffer claims in flight ([`Reserved`]).
    claiming: usize,
}

impl State {
    /// Jobs buffered or on their way.
    fn held(&self) -> usize {
        self.jobs.len() + self.claiming
    }
}

/// Room in the buffer taken by one claim in flight; given back when
/// dropped (after the claim's jobs are pushed, or on its error or panic).
pub(crate) struct Reserved<'a> {
    prefetch: &'a Prefetch,
    jobs: usize,
}

impl Reserved<'_> {
    /// How many jobs the claim may take for the buffer.
    pub(crate) fn jobs(&self) -> usize {
        self.jobs
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.prefetch.state().claiming -= self.jobs;
    }
}

impl Prefetch {
    /// A buffer of at most `cap` jobs (0: off).
    pub(crate) fn new(cap: usize) -> Prefetch {
        Prefetch {
            state: Mutex::new(State::default()),
            cap,
            refill: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("prefetch buffer")
    }

    /// Reserve room for a claim about to be sent: at most `most` jobs, and
    /// no more than the buffer has room for once every claim in flight
    /// has landed. Several claims may be in flight at once (`LeaseTurn`):
    /// together they never take more than the buffer holds.
    pub(crate) fn reserve(&self, most: usize) -> Reserved<'_> {
        let mut state = self.state();
        let jobs = self.cap.saturating_sub(state.held()).min(most);
        state.claiming += jobs;
        Reserved {
            prefetch: self,
            jobs,
        }
    }

    /// Jobs buffered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state().jobs.len()
    }

    /// Buffer a claimed job.
    pub(crate) fn push(&self, job: Leased) {
        self.state().jobs.push_back(job);
    }

    /// The next job to start, in claim order. Asks for a refill when what
    /// is buffered and on its way is down to half (so it never runs dry
    /// under a steady load); the caller then wakes a claim task, which may
    /// be idle.
    pub(crate) fn pop(&self) -> Option<(Leased, bool)> {
        let (job, held) = {
            let mut state = self.state();
            (state.jobs.pop_front(), state.held())
        };
        let job = job?;
        let refill = held * 2 <= self.cap;
        if refill {
            self.refill.notify_one();
        }
        Some((job, refill))
    }

    /// The buffered jobs whose cancel came, out of the buffer.
    pub(crate) fn take_cancelled(&self) -> Vec<Leased> {
        let mut state = self.state();
        let (cancelled, kept): (Vec<Leased>, Vec<Leased>) = std::mem::take(&mut state.jobs)
            .into_iter()
            .partition(|j| j.watch.cancelled());
        state.jobs = kept.into();
        cancelled
    }

    /// Every buffered job, emptying the buffer (shutdown: they go back).
    pub(crate) fn drain(&self) -> Vec<Leased> {
        self.state().jobs.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Prefetch;

    #[test]
    fn an_empty_or_off_buffer_has_the_room_of_its_cap() {
        assert_eq!(Prefetch::new(0).reserve(100).jobs(), 0);
        assert_eq!(Prefetch::new(8).reserve(100).jobs(), 8);
        assert_eq!(Prefetch::new(8).reserve(3).jobs(), 3);
        assert!(Prefetch::new(8).pop().is_none());
        assert!(Prefetch::new(8).drain().is_empty());
        assert_eq!(Prefetch::new(8).len(), 0);
    }

    #[test]
    fn claims_in_flight_at_once_never_reserve_more_than_the_buffer_holds() {
        let p = Prefetch::new(8);
        let first = p.reserve(100);
        assert_eq!(first.jobs(), 8);
        assert_eq!(p.reserve(100).jobs(), 0, "the first claim took the room");
        drop(first);
        let (a, b) = (p.reserve(5), p.reserve(100));
        assert_eq!((a.jobs(), b.jobs()), (5, 3));
        drop((a, b));
        assert_eq!(p.reserve(100).jobs(), 8, "room given back when claims land");
    }
}
