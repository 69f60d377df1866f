//! The completer: writes lease-mode outcomes in batches. Every run that
//! ends sends its resolution here; the completer takes everything that has
//! arrived and writes it with at most six statements (done, back to the
//! queue, snoozed, sleeping, waiting for a signal, dead; the waits followed
//! by the take of kept signals for their keys), each fenced by the claim tokens. While a flush is in
//! flight, new outcomes queue up and go out together in the next one, so
//! the batch size follows the load with no added delay when idle.
//!
//! A write that fails for a connection reason is retried with backoff for
//! up to a lease length (the heartbeat keeps the leases meanwhile); after
//! that the leases expire and the rescuer puts the jobs back (they run
//! again: at-least-once). A token that matches no row was fenced out: the
//! lease was lost and the job is someone else's; nothing is written for it.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::claim::context::ClaimContext;
use crate::claim::outcome::{write_of, Finished, Write};
use crate::db::connect::PooledConn;
use crate::error::{Error, Result};
use crate::handler::Delivery;
use crate::job::Resolution;

use crate::db::sql::{
    Db, LEASE_BURY as BURY, LEASE_DONE as DONE, LEASE_DONE_HISTORY as DONE_HISTORY,
    LEASE_DONE_RESULTS as DONE_RESULTS, LEASE_REQUEUE as REQUEUE, LEASE_SLEEP as SLEEP,
    LEASE_SNOOZE as SNOOZE, LEASE_WAIT as WAIT, SIGNAL_TAKE,
};

/// Most outcomes written by one flush.
pub(crate) const FLUSH_MAX: usize = 2000;

/// Write outcomes until `done` is cancelled and everything received is
/// written.
pub(crate) async fn run(
    ctx: Arc<ClaimContext>,
    mut rx: mpsc::UnboundedReceiver<Finished>,
    done: CancellationToken,
) {
    loop {
        let first = tokio::select! {
            biased;
            f = rx.recv() => f,
            _ = done.cancelled() => rx.try_recv().ok(),
        };
        let Some(first) = first else { return };
        let mut batch = vec![first];
        while batch.len() < FLUSH_MAX {
            match rx.try_recv() {
                Ok(f) => batch.push(f),
                Err(_) => break,
            }
        }
        flush(&ctx, batch).await;
    }
}

/// The rows of one flush, by statement.
#[derive(Default)]
struct Writes {
    done: Vec<i64>,
    /// Results of `done` (JSON text or NULL).
    done_results: Vec<Option<String>>,
    /// Whether history is on: done jobs are recorded with their results.
    history: bool,
    back_tokens: Vec<i64>,
    back_attempts: Vec<i32>,
    back_errors: Vec<Option<String>>,
    back_delays: Vec<Option<f64>>,
    snooze_tokens: Vec<i64>,
    snooze_attempts: Vec<i32>,
    snooze_delays: Vec<f64>,
    sleep_tokens: Vec<i64>,
    sleep_attempts: Vec<i32>,
    sleep_delays: Vec<f64>,
    wait_tokens: Vec<i64>,
    wait_attempts: Vec<i32>,
    wait_delays: Vec<f64>,
    wait_keys: Vec<String>,
    dead_tokens: Vec<i64>,
    dead_errors: Vec<String>,
}

impl Writes {
    fn of<'a>(batch: impl Iterator<Item = &'a Finished>, history: bool) -> Writes {
        let mut w = Writes {
            history,
            ..Writes::default()
        };
        for f in batch {
            let token = f.claimed.token;
            match write_of(&f.claimed, &f.resolution, Delivery::Lease) {
                Write::Done => {
                    w.done.push(token);
                    w.done_results.push(f.result.clone());
                }
                Write::Back {
                    delay,
                    attempts,
                    last_error,
                } => {
                    w.back_tokens.push(token);
                    w.back_attempts.push(attempts);
                    w.back_errors.push(last_error);
                    w.back_delays.push(delay.map(|d| d.as_secs_f64()));
                }
                // The last error stays in the leased row, which the
                // statement moves back whole.
                Write::Snooze {
                    delay, attempts, ..
                } => {
                    w.snooze_tokens.push(token);
                    w.snooze_attempts.push(attempts);
                    w.snooze_delays.push(delay.as_secs_f64());
                }
                Write::Sleep {
                    delay, attempts, ..
                } => {
                    w.sleep_tokens.push(token);
                    w.sleep_attempts.push(attempts);
                    w.sleep_delays.push(delay.as_secs_f64());
                }
                Write::Wait {
                    delay,
                    key,
                    attempts,
                    ..
                } => {
                    w.wait_tokens.push(token);
                    w.wait_attempts.push(attempts);
                    w.wait_delays.push(delay.as_secs_f64());
                    w.wait_keys.push(key);
                }
                Write::Dead { reason, .. } => {
                    w.dead_tokens.push(token);
                    w.dead_errors.push(reason);
                }
                Write::Nothing => {}
            }
        }
        w
    }

    /// The same writes, done jobs recorded without their results.
    fn without_results(mut self) -> Writes {
        self.done_results.iter_mut().for_each(|r| *r = None);
        self
    }

    /// Run the writes (pipelined); returns the tokens that matched.
    async fn write(&self, ctx: &ClaimContext) -> Result<HashSet<i64>> {
        let mut conn = PooledConn::get(&ctx.pool, "completer: no connection").await?;
        let (done, back, snoozed, sleeping, waiting, dead) = {
            let c = Db::pooled(&conn, ctx.config.prepared_statements);
            let done = async {
                if self.done.is_empty() {
                    return Ok(Vec::new());
                }
                // History on: the completion and its history row are one
                // statement, fenced by the same tokens. Results (history on
                // or off) are kept on the edges of jobs with children by the
                // same statement (a flow's child reads them).
                let results = &self.done_results;
                if self.history {
                    c.query(&DONE_HISTORY, &[&self.done, results]).await
                } else if results.iter().any(Option::is_some) {
                    c.query(&DONE_RESULTS, &[&self.done, results]).await
                } else {
                    c.query(&DONE, &[&self.done]).await
                }
            };
            let back = async {
                if self.back_tokens.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(
                    &REQUEUE,
                    &[
                        &self.back_tokens,
                        &self.back_attempts,
                        &self.back_errors,
                        &self.back_delays,
                    ],
                )
                .await
            };
            let snoozed = async {
                if self.snooze_tokens.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(
                    &SNOOZE,
                    &[
                        &self.snooze_tokens,
                        &self.snooze_attempts,
                        &self.snooze_delays,
                    ],
                )
                .await
            };
            let sleeping = async {
                if self.sleep_tokens.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(
                    &SLEEP,
                    &[&self.sleep_tokens, &self.sleep_attempts, &self.sleep_delays],
                )
                .await
            };
            // The waits first, then (their keys' locks taken, so that a
            // signal sent meanwhile is seen) the kept signals for their keys.
            let waiting = async {
                if self.wait_tokens.is_empty() {
                    return Ok(Vec::new());
                }
                let rows = c
                    .query(
                        &WAIT,
                        &[
                            &self.wait_tokens,
                            &self.wait_attempts,
                            &self.wait_delays,
                            &self.wait_keys,
                        ],
                    )
                    .await?;
                if !rows.is_empty() {
                    c.query(&SIGNAL_TAKE, &[&self.wait_keys]).await?;
                }
                Ok(rows)
            };
            let dead = async {
                if self.dead_tokens.is_empty() {
                    return Ok(Vec::new());
                }
                c.query(&BURY, &[&self.dead_tokens, &self.dead_errors])
                    .await
            };
            tokio::join!(done, back, snoozed, sleeping, waiting, dead)
        };
        let mut matched = HashSet::new();
        for rows in [done, back, snoozed, sleeping, waiting, dead] {
            let rows = conn.check(rows).map_err(Error::db("completer"))?;
            matched.extend(rows.iter().map(|r| r.get::<_, i64>(0)));
        }
        Ok(matched)
    }
}

/// Write one batch of outcomes, then report them.
async fn flush(ctx: &ClaimContext, batch: Vec<Finished>) {
    let history = ctx.history.on();
    // A job of an ordering key that leaves leased_jobs may free the key's
    // next job, which no INSERT (so no NOTIFY) announces: claim again here
    // rather than at the next poll.
    // So may a job of a limited queue: its slot is free once its lease row
    // is gone, and a claim that found every slot held went idle.
    let keyed = batch.iter().any(|f| {
        f.claimed.keys.ordering_key.is_some()
            || ctx.choice.ready_queues.is_limited(&f.claimed.job.queue)
    });
    let writes = Writes::of(batch.iter(), history);
    let matched = match write_retrying(ctx, &writes).await {
        Ok(m) => Some(m),
        Err(e) if !e.is_transient() => {
            // A data error (never expected: reasons are sanitised): write
            // each outcome alone so one cannot hold back the others.
            tracing::error!(error = %e, "writing lease-mode outcomes failed; writing them one by one");
            let mut all = HashSet::new();
            for f in &batch {
                let alone = Writes::of(std::iter::once(f), history);
                let written = match alone.write(ctx).await {
                    // A done job's result the database cannot store (say a
                    // number beyond jsonb's range): the job is done all the
                    // same, recorded without it, never run again.
                    Err(e) if f.result.is_some() => {
                        tracing::warn!(job = f.claimed.job.id, error = %e, "the job's result cannot be stored; recording it done without its result");
                        alone.without_results().write(ctx).await
                    }
                    r => r,
                };
                match written {
                    Ok(m) => all.extend(m),
                    Err(e) => {
                        tracing::error!(job = f.claimed.job.id, error = %e, "cannot write this job's outcome; its lease will expire and it runs again")
                    }
                }
            }
            Some(all)
        }
        Err(e) => {
            tracing::error!(error = %e, jobs = batch.len(), "giving up on writing lease-mode outcomes; the leases will expire and the jobs run again");
            None
        }
    };
    for f in batch {
        ctx.lease.book.remove(f.claimed.token);
        let written = matches!(&matched, Some(m) if m.contains(&f.claimed.token));
        let fenced = !written && !matches!(f.resolution, Resolution::Lost | Resolution::Cancelled);
        if fenced && matched.is_some() {
            tracing::warn!(
                job = f.claimed.job.id,
                attempt = f.claimed.job.attempt,
                "late outcome fenced: the lease was rescued, the job runs again"
            );
        }
        let resolution = crate::claim::outcome::resolve::after_lease_write(f.resolution, written);
        ctx.report(&f.claimed, resolution, f.duration);
    }
    if keyed {
        ctx.wake
            .wake_one(crate::claim::choose::wake::Trigger::Drain);
    }
}

/// Retry a flush on connection errors for up to one lease length.
async fn write_retrying(ctx: &ClaimContext, writes: &Writes) -> Result<HashSet<i64>> {
    let give_up = Instant::now() + ctx.config.lease_duration;
    let mut backoff = ctx.config.reconnect_backoff();
    loop {
        match writes.write(ctx).await {
            Ok(matched) => return Ok(matched),
            Err(e) if e.is_transient() && Instant::now() < give_up => {
                let delay = backoff.next().unwrap_or(ctx.config.reconnect_max);
                tracing::warn!(error = %e, retry_in = ?delay, "writing lease-mode outcomes failed");
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}
