//! Claim tasks: `concurrency` tasks that wait for a wake-up, take a free
//! slot, claim, and drain until the queue is empty. A slot is one running
//! job (a lease-mode job, or a tx-mode batch, which runs its jobs one after
//! another in its transaction).
//!
//! ```text
//!            ┌──────── wake (notify | poll | drain | reconnect) ◀──────────┐
//!            ▼                                                             │
//!   idle ──▶ take a free slot ──▶ claim (specs in turn) ──empty──▶ idle    │
//!                                   │ full → wake one more task: drain ────┘
//!                  tx: run the batch here, commit ──▶ claim again
//!               lease: take every free slot, claim that many, start each
//!                      job on its slot (lease::spawn_run) ──▶ claim again
//! ```
//!
//! Database errors never end a task: it backs off (capped, jittered) and
//! tries again, and the worker reports not-ready meanwhile.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;

use crate::claim::context::ClaimContext;
use crate::claim::tx::BatchSizer;
use crate::claim::wake::Trigger;
use crate::error::Result;
use crate::handler::Delivery;

/// What a claim round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Round {
    /// Jobs claimed.
    pub claimed: usize,
    /// Another task was turned away from a lease claim while this round
    /// held the turn ([`LeaseTurn`]): claim again for it, even if this round
    /// found nothing (its wake-up may be for jobs this claim's snapshot did
    /// not see).
    pub again: bool,
}

/// As many lease claim statements in flight per worker as it takes to fill
/// every slot: `concurrency / batch`, rounded up (one at the default batch
/// of 10 and concurrency 8).
///
/// Every lease claim takes the free slots there are, up to `batch`; with
/// one claim per task, `concurrency` tasks each held the one slot it
/// claimed with, so no slot was ever free and every statement took one job
/// (a no-op handler at concurrency 8 sent a claim per job). With fewer
/// claims in flight, each takes every slot freed while the one before was
/// in flight. More turns than that would only take slots from each other;
/// fewer would leave slots idle (at `--batch 1` one turn ran one claim of
/// one job at a time: 0.31× of the lease burn-down). A task that finds
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

    /// The turns for a worker of `concurrency` slots claiming up to `batch`
    /// jobs per statement; `tx_specs`: its plan also claims in tx mode.
    pub(crate) fn for_worker(concurrency: usize, batch: usize, tx_specs: bool) -> LeaseTurn {
        let mut t = LeaseTurn::new(concurrency.div_ceil(batch.max(1)));
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

/// One claim round holding `permit`: each spec of the plan in turn, until
/// one finds jobs.
pub(crate) async fn claim_round(
    ctx: &Arc<ClaimContext>,
    trigger: Trigger,
    permit: OwnedSemaphorePermit,
    sizer: &mut BatchSizer,
) -> Result<Round> {
    let mut permits = vec![permit];
    let (mut turned_away, mut again) = (false, false);
    for spec in crate::claim::plan::rotated(&ctx.plan, &ctx.cursor) {
        let claimed = match spec.mode {
            Delivery::Tx => {
                // A batch holds one slot while it runs.
                permits.truncate(1);
                crate::claim::tx::claim_and_run(ctx, spec, sizer.size(), sizer, trigger).await?
            }
            Delivery::Lease => {
                let Some(turn) = ctx.lease_turn.take() else {
                    // Every turn is taken by another task's lease claim;
                    // the first to end claims again for us.
                    turned_away = true;
                    continue;
                };
                // Claim as many jobs as there are free slots, one statement.
                while permits.len() < ctx.config.batch {
                    match ctx.slots.clone().try_acquire_owned() {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                let draining = (trigger == Trigger::Drain).then(|| ctx.wait_state.draining_claim());
                let r = crate::claim::lease::claim(ctx, spec, permits.len(), trigger).await;
                again |= ctx.lease_turn.end(turn);
                drop(draining);
                let (claimed, sent) = r?;
                let n = claimed.len();
                // A full claim: there is more. This task claims it next
                // round, and another alongside when that helps.
                if n == permits.len() && ctx.lease_turn.full_claim_wakes_another() {
                    ctx.wake.wake_one(Trigger::Drain);
                }
                for c in claimed {
                    let permit = permits.pop().expect("one permit per claimed job");
                    crate::claim::lease::spawn_run(ctx.clone(), c, sent, permit);
                }
                if permits.is_empty() {
                    return Ok(Round { claimed: n, again });
                }
                n
            }
        };
        if claimed > 0 {
            return Ok(Round { claimed, again });
        }
    }
    if turned_away || again {
        // A holder of a turn (this task, when `again`) claims once more: no
        // reason to read the ready queues again.
        return Ok(Round { claimed: 0, again });
    }
    // Nothing anywhere after an event (a notification, a poll, a
    // reconnect): the list of ready queues is read again (fair.rs: with no
    // limited queue, only if the next round finds nothing too; that round,
    // often an idle worker's pickup, then claims once more at once, with
    // the read). Not after a drain round that found its peers had taken the
    // rest: nothing new happened, and re-reading there (every burst ends
    // with one per claim task) cost lease mode a quarter of its claim time.
    if trigger != Trigger::Drain && ctx.ready_queues.found_nothing() {
        return Ok(Round {
            claimed: 0,
            again: true,
        });
    }
    Ok(Round {
        claimed: 0,
        again: false,
    })
}

/// One claim task: wait, claim, run, drain; until `stop`.
pub(crate) async fn run_task(ctx: Arc<ClaimContext>) {
    let mut sizer = BatchSizer::new(ctx.config.batch);
    loop {
        ctx.wait_state.enter_idle();
        let woke = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => None,
            t = ctx.wake.wait() => Some(t),
        };
        ctx.wait_state.leave_idle();
        let Some(mut trigger) = woke else { return };
        let mut backoff = ctx.config.reconnect_backoff();
        loop {
            let permit = tokio::select! {
                biased;
                _ = ctx.stop.cancelled() => return,
                p = ctx.slots.clone().acquire_owned() => p.expect("the slot semaphore is never closed"),
            };
            // A bug in a claim round must not take the task down with it:
            // the round's claim transaction rolls back (its jobs return), and
            // the task carries on.
            let round = AssertUnwindSafe(claim_round(&ctx, trigger, permit, &mut sizer))
                .catch_unwind()
                .await
                .unwrap_or_else(|panic| {
                    tracing::error!(panic = ?panic.downcast_ref::<&str>().copied().or(panic.downcast_ref::<String>().map(|s| s.as_str())), "claim round panicked; its jobs return to the queue");
                    Err(crate::Error::Panicked("a claim round"))
                });
            match round {
                Ok(round) => {
                    ctx.health.set_db(true);
                    if round.claimed == 0 && !round.again {
                        break;
                    }
                    if round.claimed > 0 {
                        ctx.wait_state.hit();
                    }
                    backoff = ctx.config.reconnect_backoff();
                    trigger = Trigger::Drain;
                }
                Err(e) => {
                    if e.is_transient() {
                        ctx.health.set_db(false);
                    }
                    let delay = backoff.next().unwrap_or(ctx.config.reconnect_max);
                    tracing::warn!(error = %e, retry_in = ?delay, "claim failed");
                    tokio::select! {
                        _ = ctx.stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    trigger = Trigger::Poll;
                }
            }
        }
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
        assert_eq!(LeaseTurn::for_worker(8, 10, false).turns(), 1);
        assert_eq!(LeaseTurn::for_worker(8, 1, false).turns(), 8);
        assert_eq!(LeaseTurn::for_worker(100, 10, false).turns(), 10);
        assert_eq!(LeaseTurn::for_worker(8, 3, false).turns(), 3);
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
