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
//!                      job on its slot (leasemode::spawn_run) ──▶ claim again
//! ```
//!
//! Database errors never end a task: it backs off (capped, jittered) and
//! tries again, and the worker reports not-ready meanwhile.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::sync::OwnedSemaphorePermit;

use crate::context::ClaimContext;
use crate::error::Result;
use crate::handler::Delivery;
use crate::txmode::BatchSizer;
use crate::wake::Trigger;

/// One claim round holding `permit`: each spec of the plan in turn, until
/// one finds jobs. Returns how many were claimed.
pub(crate) async fn claim_round(
    ctx: &Arc<ClaimContext>,
    trigger: Trigger,
    permit: OwnedSemaphorePermit,
    sizer: &mut BatchSizer,
) -> Result<usize> {
    let mut permits = vec![permit];
    for spec in crate::plan::rotated(&ctx.plan, &ctx.cursor) {
        let claimed = match spec.mode {
            Delivery::Tx => {
                // A batch holds one slot while it runs.
                permits.truncate(1);
                crate::txmode::claim_and_run(ctx, spec, sizer.size(), sizer, trigger).await?
            }
            Delivery::Lease => {
                // Claim as many jobs as there are free slots, one statement.
                while permits.len() < ctx.config.batch {
                    match ctx.slots.clone().try_acquire_owned() {
                        Ok(p) => permits.push(p),
                        Err(_) => break,
                    }
                }
                let (claimed, sent) =
                    crate::leasemode::claim(ctx, spec, permits.len(), trigger).await?;
                let n = claimed.len();
                if n == permits.len() {
                    ctx.wake.wake_one(Trigger::Drain);
                }
                for c in claimed {
                    let permit = permits.pop().expect("one permit per claimed job");
                    crate::leasemode::spawn_run(ctx.clone(), c, sent, permit);
                }
                if permits.is_empty() {
                    return Ok(n);
                }
                n
            }
        };
        if claimed > 0 {
            return Ok(claimed);
        }
    }
    // Nothing anywhere after an event (a notification, a poll, a
    // reconnect): the next round re-reads which queues are ready. Not after
    // a drain round that found its peers had taken the rest: nothing new
    // happened, and re-reading there (every burst ends with one per claim
    // task) cost lease mode a quarter of its claim time.
    if trigger != Trigger::Drain {
        ctx.ready_queues.invalidate();
    }
    Ok(0)
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
                Ok(claimed) => {
                    ctx.health.set_db(true);
                    if claimed == 0 {
                        break;
                    }
                    ctx.wait_state.hit();
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
