//! Lease turns: how many lease claim statements a worker has in flight.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

/// As many lease claim statements in flight per worker as it takes to fill
/// every slot: `concurrency / batch`, rounded up (one at the default batch
/// of 100 and concurrency 8), and two with a prefetch buffer.
///
/// Every lease claim takes the free slots there are, up to `batch`; with
/// one claim per task, `concurrency` tasks each held the one slot it
/// claimed with, so no slot was ever free and every statement took one job
/// (a no-op handler at concurrency 8 sent a claim per job). With fewer
/// claims in flight, each takes every slot freed while the one before was
/// in flight. More turns than that would only take slots from each other;
/// fewer would leave slots idle (at `--batch 1` one turn ran one claim of
/// one job at a time: 0.31× of the lease burn-down). A buffer is refilled
/// by claims of a third of it each (`prefetch::CLAIM_SHARE`): with one
/// turn they went out one after the other, one statement on one backend
/// moving every job while the other core idled (a fifth of the machine at
/// 8 slots, no-op jobs); a second turn lets the next go out while one is in
/// flight. A task that finds
/// every turn taken goes back to idle and leaves a request (`again`) that a
/// holder serves with one more claim after its own: no wake-up is lost,
/// and the requests of any number of tasks cost one statement.
#[derive(Debug)]
pub(crate) struct LeaseTurn {
    turns: usize,
    /// Whether a full lease claim wakes another task (derived once, see
    /// [`LeaseTurn::full_claim_wakes_another`]).
    wake_on_full: bool,
    busy: AtomicUsize,
    again: AtomicBool,
}

/// A held turn; dropping it frees the turn (also on an error or a panic of
/// the claim).
pub(crate) struct Turn<'a>(&'a LeaseTurn);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, SeqCst);
    }
}

impl LeaseTurn {
    /// `turns` lease claims in flight at most (at least one).
    pub(crate) fn new(turns: usize) -> LeaseTurn {
        let turns = turns.max(1);
        LeaseTurn {
            turns,
            wake_on_full: turns > 1,
            busy: AtomicUsize::new(0),
            again: AtomicBool::new(false),
        }
    }

    /// The turns for a worker of `concurrency` slots and `tasks` claim
    /// tasks claiming up to `batch` jobs per statement for free slots (never
    /// more turns than tasks: each claim is a task's, on a connection);
    /// `prefetch`: claims also fill a buffer (a second turn for its
    /// refills); `tx_specs`: its plan also claims in tx mode.
    pub(crate) fn for_worker(
        concurrency: usize,
        tasks: usize,
        batch: usize,
        prefetch: bool,
        tx_specs: bool,
    ) -> LeaseTurn {
        let for_slots = concurrency.div_ceil(batch.max(1));
        let turns = if prefetch {
            for_slots.max(2)
        } else {
            for_slots
        };
        let mut t = LeaseTurn::new(turns.min(tasks));
        t.wake_on_full |= tx_specs;
        t
    }

    /// How many claims may be in flight at once.
    #[cfg(test)]
    pub(crate) fn turns(&self) -> usize {
        self.turns
    }

    /// Whether a full lease claim wakes one more task to claim alongside.
    /// With one turn, another woken task could only wait for it, holding a
    /// slot the holder's next claim would have taken (slots go to waiting
    /// tasks first: every claim took one job). With more turns, or tx specs
    /// in the plan, the woken task has a claim of its own to make.
    pub(crate) fn full_claim_wakes_another(&self) -> bool {
        self.wake_on_full
    }

    /// A turn, or `None` when every turn is taken; then a holder claims
    /// again when it ends its turn.
    pub(crate) fn take(&self) -> Option<Turn<'_>> {
        if self.try_take() {
            return Some(Turn(self));
        }
        self.again.store(true, SeqCst);
        // A holder may have ended its turn, and read `again`, before the
        // store: take the turn ourselves then. Otherwise every turn is
        // still held after the store, and the first to end sees the
        // request.
        self.try_take().then(|| Turn(self))
    }

    fn try_take(&self) -> bool {
        let taken = self
            .busy
            .fetch_update(SeqCst, SeqCst, |b| (b < self.turns).then_some(b + 1))
            .is_ok();
        if taken {
            // The claim about to be sent sees every job committed before the
            // requests made so far.
            self.again.store(false, SeqCst);
        }
        taken
    }

    /// End the turn; whether a task was turned away meanwhile.
    pub(crate) fn end(&self, turn: Turn<'_>) -> bool {
        drop(turn);
        self.again.swap(false, SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::LeaseTurn;

    #[test]
    fn a_task_turned_away_leaves_a_request_the_holder_sees_when_it_ends() {
        let t = LeaseTurn::new(1);
        let held = t.take().expect("a free turn is taken");
        assert!(t.take().is_none(), "one claim in flight at a time");
        assert!(
            t.take().is_none(),
            "a task turned away does not free the holder's turn"
        );
        assert!(t.end(held), "the holder is told to claim again");
        let again = t.take().expect("the turn is free once ended");
        assert!(!t.end(again), "a request is served once");
    }

    #[test]
    fn turns_fill_every_slot_and_no_more() {
        assert_eq!(LeaseTurn::for_worker(8, 8, 10, false, false).turns(), 1);
        assert_eq!(LeaseTurn::for_worker(8, 8, 1, false, false).turns(), 8);
        assert_eq!(
            LeaseTurn::for_worker(100, 100, 10, false, false).turns(),
            10
        );
        assert_eq!(LeaseTurn::for_worker(8, 8, 3, false, false).turns(), 3);
        // A buffer's refills get a turn of their own.
        assert_eq!(LeaseTurn::for_worker(8, 8, 100, true, false).turns(), 2);
        assert_eq!(LeaseTurn::for_worker(8, 8, 3, true, false).turns(), 3);
        assert_eq!(LeaseTurn::for_worker(8, 1, 100, true, false).turns(), 1);
        // Bounded by the claim tasks (so by connections).
        assert_eq!(LeaseTurn::for_worker(300, 8, 10, false, false).turns(), 8);
        let t = LeaseTurn::new(2);
        let (a, b) = (t.take().unwrap(), t.take().unwrap());
        assert!(t.take().is_none(), "at most two claims in flight");
        assert!(t.end(a), "the first holder to end serves the request");
        assert!(!t.end(b));
    }

    #[test]
    fn a_turn_is_freed_when_its_claim_fails_or_panics() {
        let t = LeaseTurn::new(1);
        let held = t.take().unwrap();
        drop(held);
        assert!(t.take().is_some(), "a dropped turn is free");
    }

    #[test]
    fn a_request_racing_the_end_of_the_turn_is_never_lost() {
        // Many tasks take, request and end turns at once: every request is
        // either seen by the holder that ended after it, or made by a task
        // that then took the turn itself (its own claim serves it).
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        use std::sync::Arc;
        let t = Arc::new(LeaseTurn::new(2));
        let served = Arc::new(AtomicUsize::new(0));
        let turned_away = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let (t, served, turned_away) = (t.clone(), served.clone(), turned_away.clone());
                s.spawn(move || {
                    for _ in 0..20_000 {
                        match t.take() {
                            Some(turn) => {
                                if t.end(turn) {
                                    served.fetch_add(1, SeqCst);
                                }
                            }
                            None => {
                                turned_away.fetch_add(1, SeqCst);
                            }
                        }
                    }
                });
            }
        });
        // After the last turn ended no request is pending: each one was
        // handed to a holder (or superseded by a turn that started later).
        assert!(!t.again.load(SeqCst), "a request left unserved");
        if turned_away.load(SeqCst) > 0 {
            assert!(
                served.load(SeqCst) > 0,
                "requests were never handed to a holder"
            );
        }
    }
}
