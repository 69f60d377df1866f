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
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;

use crate::claim::choose::wake::Trigger;
use crate::claim::context::ClaimContext;
use crate::claim::tx::BatchSizer;
use crate::error::Result;
use crate::handler::Delivery;

/// What a claim round did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Round {
    /// Jobs claimed.
    pub claimed: usize,
    /// Another task was turned away from a lease claim while this round
    /// held the turn ([`LeaseTurn`](crate::claim::lease::turn::LeaseTurn)),
    /// or a claim of this worker found nothing beside this round's
    /// ([`Overlap`](crate::claim::choose::overlap::Overlap)): claim again for
    /// it, even if this round found nothing (its wake-up may be for jobs
    /// this claim's snapshot did not see).
    pub again: bool,
}

/// One claim round holding `permit`: each spec of the plan in turn, until
/// one finds jobs. Without a permit (a refill of the lease prefetch buffer,
/// `prefetch.rs`) only lease specs claim, for the buffer and any slot free
/// by then.
pub(crate) async fn claim_round(
    ctx: &Arc<ClaimContext>,
    trigger: Trigger,
    permit: Option<OwnedSemaphorePermit>,
    sizer: &mut BatchSizer,
) -> Result<Round> {
    let started = std::time::Instant::now();
    let mut permits: Vec<OwnedSemaphorePermit> = permit.into_iter().collect();
    let (mut turned_away, mut again) = (false, false);
    for spec in crate::claim::choose::plan::rotated(&ctx.choice.plan, &ctx.choice.cursor) {
        let claimed = match spec.mode {
            Delivery::Tx if permits.is_empty() => continue,
            Delivery::Tx => {
                // A batch holds one slot while it runs.
                permits.truncate(1);
                // Under pressure (the sampler's last reading), a smaller batch.
                let limit =
                    crate::claim::tx::batch_limit(sizer.size(), ctx.health.under_pressure());
                // After a partial batch: one claim per pace (idle.rs),
                // waited for as a draining claim.
                let pace = ctx.config.claim_pace;
                if let Some(wait) = ctx.choice.wait_state.pace_turn(pace) {
                    let _draining = ctx.choice.wait_state.draining_claim();
                    tokio::select! {
                        _ = ctx.stop.cancelled() => return Ok(Round { claimed: 0, again: false }),
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
                let crate::claim::tx::TxClaim {
                    claimed,
                    again: more,
                } = crate::claim::tx::claim_and_run(ctx, spec, limit, sizer, trigger).await?;
                // A claim of this worker beside this one found nothing:
                // claim once more (choose/overlap.rs).
                again |= more;
                ctx.choice.wait_state.paced(claimed, limit, pace);
                ctx.health.count_claimed(claimed);
                claimed
            }
            Delivery::Lease => {
                let Some(turn) = ctx.lease.turn.take() else {
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
                // And a share of the room in the prefetch buffer (what the
                // batch leaves, or a third of the buffer if more), so a slot
                // freed meanwhile starts its next job at once; the room is
                // reserved until the jobs are in the buffer, so claims in
                // flight at once never overfill it.
                let free = permits.len();
                let reserved = ctx
                    .lease
                    .prefetch
                    .reserve(ctx.config.batch.max(free) - free);
                let limit = free + reserved.jobs();
                if limit == 0 {
                    again |= ctx.lease.turn.end(turn);
                    continue;
                }
                let draining =
                    (trigger == Trigger::Drain).then(|| ctx.choice.wait_state.draining_claim());
                let in_flight = ctx.choice.overlap.begin();
                let r = crate::claim::lease::claim(ctx, spec, limit, free, trigger).await;
                if let Ok((claimed, _)) = &r {
                    // One autocommit statement: its slot locks are gone.
                    again |= in_flight.end(!claimed.is_empty());
                }
                again |= ctx.lease.turn.end(turn);
                drop(draining);
                let (claimed, sent) = r?;
                let n = claimed.len();
                // A full claim: there is more. This task claims it next
                // round, and another alongside when that helps.
                if n == limit && ctx.lease.turn.full_claim_wakes_another() {
                    ctx.wake.wake_one(Trigger::Drain);
                }
                for c in claimed {
                    let job = crate::claim::lease::leased(ctx, c, sent);
                    match permits.pop() {
                        Some(permit) => crate::claim::lease::spawn_run(ctx.clone(), job, permit),
                        None => crate::claim::lease::buffer(ctx, job, sent),
                    }
                }
                drop(reserved);
                ctx.health.count_claimed(n);
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
    if trigger != Trigger::Drain
        && ctx
            .choice
            .ready_queues
            .found_nothing(started, ctx.pressure_throttle())
    {
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
        ctx.choice.wait_state.enter_idle();
        let woke = tokio::select! {
            biased;
            _ = ctx.stop.cancelled() => None,
            t = ctx.wake.wait() => Some(t),
        };
        ctx.choice.wait_state.leave_idle();
        let Some(mut trigger) = woke else { return };
        let mut backoff = ctx.config.reconnect_backoff();
        loop {
            let permit = tokio::select! {
                biased;
                _ = ctx.stop.cancelled() => return,
                p = ctx.slots.clone().acquire_owned() => Some(p.expect("the slot semaphore is never closed")),
                // Every slot busy, the prefetch buffer below half: refill it.
                _ = ctx.lease.prefetch.refill.notified() => None,
            };
            // A free slot starts a buffered job first, without a round trip.
            let permit = match permit.map(|p| (p, ctx.lease.prefetch.pop())) {
                Some((p, Some((job, _)))) => {
                    crate::claim::lease::spawn_run(ctx.clone(), job, p);
                    trigger = Trigger::Drain;
                    continue;
                }
                Some((p, None)) => Some(p),
                None => None,
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
                        ctx.choice.wait_state.hit();
                    }
                    backoff = ctx.config.reconnect_backoff();
                    trigger = Trigger::Drain;
                }
                Err(e) => {
                    // Not ready while claims fail, whatever the reason: a
                    // worker that cannot claim must not look healthy.
                    ctx.health.set_db(false);
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
