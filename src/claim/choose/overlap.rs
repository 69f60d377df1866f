//! Claims of one worker that overlap: none may lose a wake-up to another.
//!
//! A claim of a limited queue locks a free row of `pgwake.queue_slots`
//! (claim_tx_limited.sql, claim_lease_limited.sql: `FOR UPDATE SKIP
//! LOCKED`) and keeps it locked until its transaction ends, also when it
//! finds no job: in tx mode until the claim transaction's COMMIT, a round
//! trip after the statement; in lease mode until the statement's own
//! commit. Another claim sent meanwhile (woken by a job committed after the
//! first one's snapshot) skips that slot and finds nothing either: the job
//! is seen by neither, and waits for the next wake-up, which may be the
//! fallback poll.
//!
//! ```text
//!  claim 1: BEGIN; lock slot; no job ─────────────── COMMIT ─▶ ends last:
//!  job C committed, NOTIFY                                      claims again
//!  claim 2:            skip slot; no job; COMMIT ─▶ asks       (sees C)
//! ```
//!
//! A claim that found nothing while another of the worker's claims was
//! in flight (begun before it, or since) asks for one more claim; the claim
//! that ends when none is in flight any more serves every request with one
//! claim, which begins after each of those claims has ended. A claim that
//! found jobs serves them too: its task claims again (a tx batch when it
//! has ended and freed its slot). Slots locked by another worker process
//! are not this worker's to wait for: that worker was woken by the same
//! notification, or re-checks the queue when it registers for them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// The claims of one worker in flight.
#[derive(Debug, Default)]
pub(crate) struct Overlap {
    in_flight: AtomicUsize,
    /// Claims begun so far: a claim that sees it move had another begin
    /// while it was in flight.
    begun: AtomicU64,
    /// A claim that found nothing beside another asked for one more.
    again: AtomicBool,
}

/// One claim in flight, from before its statement until its transaction
/// has ended (or its jobs are claimed). Dropped without
/// [`InFlight::end`] (an error, a panic), it leaves the count and any
/// request to the others.
pub(crate) struct InFlight<'a> {
    overlap: &'a Overlap,
    /// The value of `begun` this claim set.
    seq: u64,
    /// Another claim was in flight when this one began.
    joined: bool,
    ended: bool,
}

impl Overlap {
    /// A claim begins.
    pub(crate) fn begin(&self) -> InFlight<'_> {
        let joined = self.in_flight.fetch_add(1, SeqCst) > 0;
        let seq = self.begun.fetch_add(1, SeqCst) + 1;
        InFlight {
            overlap: self,
            seq,
            joined,
            ended: false,
        }
    }
}

impl InFlight<'_> {
    /// The claim ended, having found jobs (`found`) or not. Whether its task
    /// claims once more: it is the last in flight and a claim that found
    /// nothing beside another asked for it (this one, or one before).
    pub(crate) fn end(mut self, found: bool) -> bool {
        self.ended = true;
        let o = self.overlap;
        let beside = self.joined || o.begun.load(SeqCst) != self.seq;
        if !found && beside {
            // Asked before leaving, so that whoever leaves last sees it.
            o.again.store(true, SeqCst);
        }
        if o.in_flight.fetch_sub(1, SeqCst) > 1 {
            return false;
        }
        // The last in flight: serve the requests. Found jobs: this task
        // claims again anyway once its batch has ended.
        o.again.swap(false, SeqCst) && !found
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.overlap.in_flight.fetch_sub(1, SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Overlap;

    #[test]
    fn a_claim_alone_that_finds_nothing_claims_no_more() {
        let o = Overlap::default();
        assert!(!o.begin().end(false));
        assert!(!o.begin().end(true));
    }

    #[test]
    fn the_claim_that_ends_last_claims_again_for_one_that_found_nothing_beside_it() {
        let o = Overlap::default();
        let first = o.begin();
        let second = o.begin();
        assert!(!second.end(false), "the first is still in flight");
        assert!(first.end(false), "the last to end claims again");
        assert!(!o.begin().end(false), "a request is served once");

        // The first to begin ends first: the second, alone now, claims again.
        let first = o.begin();
        let second = o.begin();
        assert!(!first.end(false));
        assert!(second.end(false));
    }

    #[test]
    fn a_claim_that_found_jobs_serves_the_request_with_its_next_claim() {
        let o = Overlap::default();
        let first = o.begin();
        let second = o.begin();
        assert!(!second.end(false));
        assert!(!first.end(true), "its task claims again after its batch");
        assert!(!o.begin().end(false), "the request was served");
    }

    #[test]
    fn a_claim_that_fails_leaves_its_request_to_the_others() {
        let o = Overlap::default();
        let first = o.begin();
        let second = o.begin();
        assert!(!second.end(false));
        drop(first);
        let next = o.begin();
        assert!(next.end(false), "the request outlived the failed claim");
    }

    #[test]
    fn requests_racing_the_ends_are_never_lost() {
        // Claims begin and end on four threads at once; after the last has
        // ended no request is pending: each was served by the last in
        // flight at some moment after it was made.
        use std::sync::Arc;
        let o = Arc::new(Overlap::default());
        std::thread::scope(|s| {
            for t in 0..4 {
                let o = o.clone();
                s.spawn(move || {
                    for i in 0..20_000 {
                        let c = o.begin();
                        let _ = c.end((i + t) % 3 == 0);
                    }
                });
            }
        });
        assert_eq!(o.in_flight.load(std::sync::atomic::Ordering::SeqCst), 0);
        assert!(
            !o.again.load(std::sync::atomic::Ordering::SeqCst),
            "a request left unserved"
        );
    }
}
