//! Whether the claim tasks are idle or draining, as they report it: the
//! waiting registration (`services/waiting.rs`) registers the worker for a
//! NOTIFY only when some task is idle and no claim found jobs within
//! [`LINGER`].
//!
//! And the pacing of tx-mode claims
//! ([`WorkerConfig::claim_pace`](crate::WorkerConfig)): once a claim
//! finds jobs but fewer than it asked for, every tx claim of the worker
//! takes a turn, one per pace, until one takes a full batch. Each claim,
//! crash mark and commit is a WAL flush the producers' commits queue behind
//! and a few round trips of server time; at 1,500 jobs/s a worker that
//! claims again at once takes two or three jobs a claim, paced it takes
//! about a pace's worth. The turn is waited for as a draining claim, so the
//! worker does not register for the notifications every producer's commit
//! would then pay for. A claim after an idle wait is not delayed, and a
//! backlog (full batches) is claimed as fast as ever.

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
    /// Pacing: microseconds since `started` when the next paced tx claim
    /// may start; 0 while not pacing.
    pace_next_us: AtomicU64,
    pub(crate) changed: Notify,
}

impl Default for WaitState {
    fn default() -> Self {
        WaitState {
            started: Instant::now(),
            idle: AtomicUsize::new(0),
            claiming: AtomicUsize::new(0),
            last_hit_ms: AtomicU64::new(0),
            pace_next_us: AtomicU64::new(0),
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

    /// A tx claim is about to start: while pacing, take the next turn and
    /// return how long to wait for it (`None`: claim now). `pace` zero:
    /// never paced, and pacing ends.
    pub(crate) fn pace_turn(&self, pace: Duration) -> Option<Duration> {
        if pace.is_zero() {
            self.end_pacing();
            return None;
        }
        let now = self.micros();
        let step = pace.as_micros() as u64;
        let mut next = self.pace_next_us.load(Ordering::SeqCst);
        loop {
            if next == 0 {
                return None;
            }
            let turn = next.max(now);
            match self.pace_next_us.compare_exchange(
                next,
                turn + step,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return (turn > now).then(|| Duration::from_micros(turn - now)),
                Err(seen) => next = seen,
            }
        }
    }

    /// A tx claim took `claimed` jobs of the `limit` it asked for: a
    /// partial batch starts pacing (the next turn one pace from now), a full
    /// one ends it (a backlog: claim as fast as batches run); an empty one
    /// changes nothing.
    pub(crate) fn paced(&self, claimed: usize, limit: usize, pace: Duration) {
        if claimed >= limit || pace.is_zero() {
            self.end_pacing();
        } else if claimed > 0 {
            let next = self.micros() + pace.as_micros() as u64;
            let _ = self
                .pace_next_us
                .compare_exchange(0, next, Ordering::SeqCst, Ordering::SeqCst);
        }
    }

    /// Pacing ends. Read first: while batches come full every tx claim
    /// passes here, and a store each time would bounce the cache line
    /// between the claim tasks for nothing.
    fn end_pacing(&self) {
        if self.pace_next_us.load(Ordering::Relaxed) != 0 {
            self.pace_next_us.store(0, Ordering::SeqCst);
        }
    }

    /// Microseconds since `started`, at least 1 (0 means "not pacing").
    fn micros(&self) -> u64 {
        self.started.elapsed().as_micros() as u64 + 1
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

#[cfg(test)]
mod tests {
    use super::*;

    const PACE: Duration = Duration::from_millis(50);

    #[test]
    fn a_partial_batch_paces_the_next_claims_one_turn_each() {
        let s = WaitState::default();
        assert_eq!(s.pace_turn(PACE), None, "not pacing yet");
        s.paced(3, 10, PACE);
        let first = s.pace_turn(PACE).expect("paced after a partial batch");
        let second = s
            .pace_turn(PACE)
            .expect("a second claim takes the next turn");
        assert!(first <= PACE, "{first:?}");
        assert!(
            second > first && second <= 2 * PACE,
            "{first:?} then {second:?}"
        );
    }

    #[test]
    fn a_full_batch_ends_pacing_and_an_empty_one_keeps_it() {
        let s = WaitState::default();
        s.paced(3, 10, PACE);
        s.paced(0, 10, PACE);
        assert!(s.pace_turn(PACE).is_some(), "an empty claim keeps pacing");
        s.paced(10, 10, PACE);
        assert_eq!(s.pace_turn(PACE), None, "a full batch ends it");
        s.paced(3, 10, Duration::ZERO);
        assert_eq!(s.pace_turn(Duration::ZERO), None, "a zero pace is off");
    }
}
