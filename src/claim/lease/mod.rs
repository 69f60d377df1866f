//! `lease` delivery mode: for work outside the database and long jobs
//! (docs/src/delivery.md; ARCHITECTURE.md, "lease mode").
//!
//! ```text
//!  claim ≤ free slots: WITH c AS (DELETE … SKIP LOCKED RETURNING *)
//!        INSERT INTO leased_jobs (attempts + 1, token, lease_until) … — autocommit
//!  each job on its own slot, concurrently, outside any transaction
//!  heartbeat (one statement per worker): renew every token this worker holds
//!     token missing → the lease was rescued: stop that run (Lost)
//!     no renewal for lease − margin → stop every run before its lease ends
//!  outcome → completer.rs: batched writes, each fenced by the claim token
//! ```
//!
//! The attempt is committed with the claim, so a job that kills its worker
//! uses up attempts and ends dead (the rescuer buries a lease that expires
//! on the last attempt). The claim token comes from a sequence and is never
//! reused: a stalled worker that wakes up after its job was rescued, retried
//! and claimed again cannot renew or complete the new run.
//!
//! Here: the lease claim, a leased job's run on its slot and the services
//! that keep leases ([`heartbeat`]) and the prefetch buffer. Beside it: the
//! lease book ([`book`]), the outcome writer ([`completer`]), the prefetch
//! buffer ([`prefetch`]), marks of buffered jobs' starts ([`starts`]),
//! the lease claims' turns ([`turn`]) and lease mode's part of the claim
//! context ([`state`]). May import
//! [`choose`](super::choose), [`outcome`](super::outcome),
//! [`run`](super::run) and the claim context; never [`tx`](super::tx).

pub(crate) mod book;
pub(crate) mod completer;
pub(crate) mod prefetch;
pub(crate) mod starts;
pub(crate) mod state;
pub(crate) mod turn;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use crate::claim::choose::plan::{ClaimSpec, Target};
use crate::claim::choose::targets::{Settled, Walk};
use crate::claim::choose::wake::Trigger;
use crate::claim::context::ClaimContext;
use crate::claim::lease::book::stop_margin;
use crate::claim::lease::prefetch::Leased;
use crate::claim::outcome::resolve::{choose, Run, Stopped};
use crate::claim::outcome::Finished;
use crate::claim::run::cancels::Watch;
use crate::claim::run::claimed::{sort_claim_order, Claimed};
use crate::claim::run::executor::execute;
use crate::claim::run::row::{ClaimRow, Mode};
use crate::db::connect::PooledConn;
use crate::error::{Error, Result};
use crate::handler::{Deadline, JobContext};
use crate::job::Resolution;
use crate::metrics;

use crate::db::sql::{
    Db, CLAIM_LEASE_ALL as CLAIM_ALL, CLAIM_LEASE_ALL_AFTER as CLAIM_ALL_AFTER,
    CLAIM_LEASE_LIMITED as CLAIM_LIMITED, CLAIM_LEASE_QUEUE as CLAIM_QUEUE,
    CLAIM_LEASE_QUEUE_AFTER as CLAIM_QUEUE_AFTER, LEASE_HEARTBEAT as HEARTBEAT,
};

/// Claim up to `limit` jobs for `spec` (one per free slot, and room in the
/// prefetch buffer), moving them into `pgwake.leased_jobs`; from a limited
/// or rate-limited queue at most `free` (the free slots: such a queue is
/// never prefetched, a buffered job would hold a running slot or an
/// admission it does not use). Returns them with the instant the claim was
/// sent (the lease is secured from then).
pub(crate) async fn claim(
    ctx: &ClaimContext,
    spec: &ClaimSpec,
    limit: usize,
    free: usize,
    trigger: Trigger,
) -> Result<(Vec<Claimed>, Instant)> {
    let mut conn = PooledConn::get(&ctx.pool, "lease claim: no connection").await?;
    let mut targets = ctx.targets(spec).await?;
    if free == 0 {
        // A claim for the buffer alone: plain queues only.
        targets.queues.retain(Walk::fills_with);
    }
    let except = &targets.except[..];
    let limit = limit as i64;
    let free = (free as i64).min(limit);
    let lease = ctx.config.lease_duration.as_secs_f64();
    let mut rows = Vec::new();
    // Per row: the claim put it in the prefetch buffer, not on a free slot
    // (`leased_jobs.buffered`: its attempt is refunded if this worker
    // dies), and it is a suspect (refunded so before).
    let mut placed: Vec<(bool, bool)> = Vec::new();
    let mut sent = Instant::now();
    // Admissions of a rate-limited queue are taken for the free slots only.
    let mut walk = ctx.walk(spec, &targets.queues, free);
    // A rate-limited queue's admissions are committed first (targets.rs).
    // Fill the free slots across plain queues (targets.rs): a limited queue
    // is claimed only by a round that found nothing before it, and ends it.
    while (rows.len() as i64) < limit {
        match walk.peek() {
            None => break,
            Some(next) if !rows.is_empty() && !Walk::fills_with(next) => break,
            Some(_) => {}
        }
        let Some(queue) = walk.next().await? else {
            break;
        };
        if walk.admission().is_some_and(|a| a.none()) {
            continue;
        }
        let cap = walk.admission().and_then(|a| a.cap());
        // The leases are secured from the first statement that took jobs.
        if rows.is_empty() {
            sent = Instant::now();
        }
        let wanted = match queue {
            // Taken first in a round or not at all (Walk::fills_with).
            Target::Limited(_) | Target::Rated(..) => free,
            Target::All | Target::Queue(_) => limit - rows.len() as i64,
        };
        // The jobs of this statement that go straight to free slots: the
        // free slots left after the jobs already claimed for slots.
        let run_now = free - placed.iter().filter(|(b, _)| !*b).count() as i64;
        let run_now = run_now.max(0);
        let ask = Ask {
            spec,
            except,
            wanted,
            run_now,
            lease,
            cap,
        };
        let db = Db::pooled(&conn, ctx.config.prepared_statements);
        let r = claim_statement(ctx, db, queue, &ask, &walk).await;
        let more = conn.check(r).map_err(Error::db("lease claim"))?;
        let stop = !more.is_empty() && !Walk::fills_with(queue);
        // A limited claim is for free slots only, never buffered.
        placed.extend(more.iter().map(|row| {
            let row = ClaimRow::read(row, Mode::Lease);
            let buffered = match queue {
                Target::All | Target::Queue(_) => row.buffered(),
                Target::Limited(_) | Target::Rated(..) => false,
            };
            (buffered, row.suspect())
        }));
        rows.extend(more);
        if stop {
            break;
        }
    }
    let used: Vec<Option<&str>> = rows
        .iter()
        .map(|r| ClaimRow::read(r, Mode::Lease).limit_key())
        .collect();
    let settled = walk.settle(&used).await?;
    let hit = if rows.is_empty() { "empty" } else { "hit" };
    ::metrics::counter!(metrics::CLAIMS, "trigger" => trigger.as_str(), "result" => hit, "mode" => "lease")
        .increment(1);
    let claimed = leased_jobs(ctx, &conn, &rows, &placed, &settled, sent).await;
    Ok((claimed, sent))
}

/// What one lease claim statement asks for.
#[derive(Clone, Copy)]
struct Ask<'s> {
    spec: &'s ClaimSpec,
    /// Queues the all-queues statement leaves to other specs.
    except: &'s [String],
    /// The jobs wanted of this statement.
    wanted: i64,
    /// Of them, those that go straight to free slots.
    run_now: i64,
    /// The lease, in seconds.
    lease: f64,
    /// A rate-limited queue's cap on this claim's admissions.
    cap: Option<i64>,
}

/// One lease claim statement on `queue` (a fair-keys queue's rotation
/// continuing where it stands, within the admissions `walk` took for it).
async fn claim_statement(
    ctx: &ClaimContext,
    db: Db<'_>,
    queue: &Target,
    ask: &Ask<'_>,
    walk: &Walk<'_>,
) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let Ask {
        spec,
        except,
        wanted,
        run_now,
        lease,
        cap,
    } = *ask;
    match queue {
        // Under pressure, after the last job claimed (cursor.rs).
        Target::All => {
            ctx.choice
                .claim_cursors
                .claim(
                    db,
                    spec,
                    None,
                    ctx.pressure_throttle(),
                    Mode::Lease,
                    (&CLAIM_ALL, &CLAIM_ALL_AFTER),
                    &[
                        &wanted,
                        &except,
                        &spec.tasks_in,
                        &spec.tasks_not_in,
                        &ctx.worker_id,
                        &lease,
                        &run_now,
                    ],
                )
                .await
        }
        Target::Queue(q) => {
            ctx.choice
                .claim_cursors
                .claim(
                    db,
                    spec,
                    Some(q),
                    ctx.pressure_throttle(),
                    Mode::Lease,
                    (&CLAIM_QUEUE, &CLAIM_QUEUE_AFTER),
                    &[
                        &wanted,
                        q,
                        &spec.tasks_in,
                        &spec.tasks_not_in,
                        &ctx.worker_id,
                        &lease,
                        &run_now,
                    ],
                )
                .await
        }
        Target::Limited(q) | Target::Rated(q, _) => {
            let after = ctx.choice.key_cursors.after(q);
            let admitted_keys = walk.admitted_keys();
            let r = db
                .query(
                    &CLAIM_LIMITED,
                    &[
                        &wanted,
                        q,
                        &spec.tasks_in,
                        &spec.tasks_not_in,
                        &ctx.worker_id,
                        &lease,
                        &cap,
                        &after,
                        &admitted_keys,
                    ],
                )
                .await
                // Keys reported for a repair.
                .map(|rows| ctx.choice.key_repairs.take_reports(q, rows, Mode::Lease));
            if let Ok((rows, stop)) = &r {
                walk.served(
                    q,
                    after.as_deref(),
                    rows.iter()
                        .map(|r| ClaimRow::read(r, Mode::Lease).limit_key()),
                    stop.as_deref(),
                );
            }
            r.map(|(rows, _)| rows)
        }
    }
}

/// The claimed rows as jobs (`placed`: each one's buffered and suspect
/// flags), in claim order with those for free slots first, their traces
/// and inputs attached, read on the claim's connection `conn`.
async fn leased_jobs(
    ctx: &ClaimContext,
    conn: &PooledConn,
    rows: &[tokio_postgres::Row],
    placed: &[(bool, bool)],
    settled: &Settled<'_>,
    sent: Instant,
) -> Vec<Claimed> {
    let mut claimed: Vec<Claimed> = rows
        .iter()
        .zip(placed)
        .map(|(row, &(buffered, suspect))| {
            let mut c = ClaimRow::read(row, Mode::Lease).claimed();
            c.buffered = buffered;
            c.suspect = suspect;
            c.admitted_at = settled.admitted_at(c.keys.limit_key.is_some());
            c
        })
        .collect();
    sort_claim_order(&mut claimed);
    if ctx.config.trace_jobs {
        let db = Db::pooled(conn, ctx.config.prepared_statements);
        crate::claim::run::trace::attach(db, &mut claimed, sent, "lease").await;
    }
    attach_inputs(
        Db::pooled(conn, ctx.config.prepared_statements),
        ctx,
        &mut claimed,
    )
    .await;
    // The jobs the database took for free slots first: those start now, the
    // others go into the buffer (claimer.rs hands out the slots in order).
    claimed.sort_by_key(|c| c.buffered);
    claimed
}

/// Read the recorded steps and parents' results of the claimed jobs whose
/// handler gives them to the run up front (`exec`), in one statement on the
/// claim's connection: a command per job would otherwise wait for a pool
/// connection and a round trip before it starts. A failed read leaves them
/// unread: the handler reads them itself.
async fn attach_inputs(db: Db<'_>, ctx: &ClaimContext, claimed: &mut [Claimed]) {
    let ids: Vec<i64> = claimed
        .iter()
        .filter(|c| {
            ctx.registry
                .get(&c.job.task)
                .is_some_and(|h| h.reads_inputs())
        })
        .map(|c| c.job.id)
        .collect();
    if ids.is_empty() {
        return;
    }
    match crate::steps::inputs_with(db, &ids).await {
        Ok(mut read) => {
            for c in claimed.iter_mut() {
                if ids.contains(&c.job.id) {
                    c.inputs = Some(read.remove(&c.job.id).unwrap_or_default());
                }
            }
        }
        Err(e) => tracing::warn!(
            error = %crate::error::PgDisplay(&e),
            jobs = ids.len(),
            "cannot read the claimed jobs' recorded steps and parents' results with the claim: each run reads its own"
        ),
    }
}

/// A claimed job leased by this worker: its token in the lease book (the
/// heartbeat renews it from now) and its id in the cancel book, whether it
/// starts at once or waits in the prefetch buffer.
pub(crate) fn leased(ctx: &ClaimContext, claimed: Claimed, secured_from: Instant) -> Leased {
    let lost = ctx.lease.book.insert(
        claimed.token,
        secured_from + ctx.config.lease_duration,
        &ctx.abort,
    );
    let watch = ctx.cancels.watch(claimed.job.id, &lost);
    Leased {
        claimed,
        lost,
        watch,
    }
}

/// Hand a run's outcome to the completer, its lease marked ended first: a
/// heartbeat that finds the row gone once the outcome is written must not
/// take it for a lost lease (`LeaseBook::renewed`).
fn complete(ctx: &ClaimContext, finished: Finished) {
    ctx.lease.book.ended(finished.claimed.token);
    ctx.lease.completer.send(finished);
}

/// Run one leased job on its own slot (`permit`), in the background; its
/// resolution goes to the completer. Then, on the same slot, the next job
/// of the prefetch buffer, until it is empty or the worker stops.
pub(crate) fn spawn_run(ctx: Arc<ClaimContext>, mut next: Leased, permit: OwnedSemaphorePermit) {
    let tracker = ctx.lease.jobs.clone();
    tracker.spawn(async move {
        loop {
            let Leased {
                claimed,
                lost,
                watch,
                ..
            } = next;
            ctx.lease.prefetch.started();
            if claimed.buffered {
                ctx.lease.start_marks.started(claimed.token);
            }
            let (resolution, result, duration) = run(&ctx, &claimed, &lost, watch).await;
            if claimed.buffered {
                ctx.lease.start_marks.ended(claimed.token);
            }
            complete(
                &ctx,
                Finished {
                    claimed,
                    resolution,
                    result,
                    duration,
                },
            );
            // At shutdown the buffer goes back whole (`hand_back`).
            if ctx.stop.is_cancelled() {
                break;
            }
            match ctx.lease.prefetch.pop() {
                Some((job, refill)) => {
                    if refill {
                        ctx.wake.wake_one(Trigger::Drain);
                    }
                    next = job;
                }
                None => break,
            }
        }
        // The slot is free once no buffered job is left to start on it;
        // the outcomes are written in the background (and the leases
        // renewed until they are).
        drop(permit);
    });
}

/// The service that ends a buffered job at once when its cancel comes:
/// buried as cancelled (fenced by its token, through the completer) without
/// waiting for a slot, never run; and hands back the buffered jobs of a
/// queue that became paused or limited (attempts refunded: such a queue is
/// claimed for free slots only, under its limits). Runs until `stop`.
pub(crate) async fn bury_cancelled(ctx: Arc<ClaimContext>, stop: CancellationToken) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ctx.cancels.cancelled_some.notified() => {}
        }
        for job in ctx.lease.prefetch.take_cancelled() {
            let stopped = Stopped {
                cancelled: true,
                lease_lost: false,
            };
            let resolution = choose(&job.claimed.job, stopped, Run::NotStarted, &ctx.config);
            complete(
                &ctx,
                Finished {
                    claimed: job.claimed,
                    resolution,
                    result: None,
                    duration: Duration::ZERO,
                },
            );
        }
        let restricted = ctx
            .lease
            .prefetch
            .take_restricted(|queue, at| ctx.cancels.restricted_since(queue, at));
        let n = give_back(&ctx, restricted);
        if n > 0 {
            tracing::info!(
                jobs = n,
                "handed back prefetched jobs of a queue paused or limited since (attempts refunded)"
            );
        }
    }
}

/// Put a job claimed at `sent` for the buffer into it; unless its queue
/// became paused or limited since the claim was sent (the claim read the
/// settings before): then it goes back at once, attempt refunded.
pub(crate) fn buffer(ctx: &ClaimContext, job: Leased, sent: Instant) {
    if ctx.cancels.restricted_since(&job.claimed.job.queue, sent) {
        give_back(ctx, vec![job]);
    } else {
        ctx.lease.prefetch.push(job);
    }
}

/// Shutdown: hand every buffered (never started) job back at once, its
/// attempt refunded, through the completer (one requeue statement, fenced
/// by the tokens, releasing keys and slots as any requeue does).
pub(crate) fn hand_back(ctx: &ClaimContext) -> usize {
    let n = give_back(ctx, ctx.lease.prefetch.drain());
    if n > 0 {
        tracing::info!(
            jobs = n,
            "handed back the prefetched jobs that never started (attempts refunded)"
        );
    }
    n
}

/// Buffered jobs back to the queue, never started: attempt refunded, unless
/// a cancel came meanwhile (buried) or the lease was lost (someone else's
/// now).
fn give_back(ctx: &ClaimContext, jobs: Vec<Leased>) -> usize {
    let n = jobs.len();
    for job in jobs {
        let stopped = Stopped {
            cancelled: job.watch.cancelled(),
            lease_lost: job.lost.is_cancelled() && !ctx.abort.is_cancelled(),
        };
        let resolution = choose(&job.claimed.job, stopped, Run::NotStarted, &ctx.config);
        complete(
            ctx,
            Finished {
                claimed: job.claimed,
                resolution,
                result: None,
                duration: Duration::ZERO,
            },
        );
    }
    n
}

/// The service that hands a stalled prefetch buffer back (prefetch.rs,
/// `take_stalled`): no job started on this worker for `--prefetch-wait`,
/// every slot busy with long runs, so the buffered jobs go back, attempts
/// refunded, for any idle worker to take (their requeue notifies). Checks
/// four times per wait. Runs until `stop`.
pub(crate) async fn hand_back_stalled(ctx: Arc<ClaimContext>, stop: CancellationToken) {
    let wait = ctx.config.prefetch_wait;
    let mut tick = tokio::time::interval((wait / 4).max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let n = give_back(&ctx, ctx.lease.prefetch.take_stalled(wait, Instant::now()));
        if n > 0 {
            tracing::info!(
                jobs = n,
                wait = ?wait,
                "handed back prefetched jobs: no slot freed meanwhile (attempts refunded)"
            );
        }
    }
}

async fn run(
    ctx: &ClaimContext,
    claimed: &Claimed,
    lost: &CancellationToken,
    watch: Watch,
) -> (Resolution, Option<String>, Duration) {
    // A job that waited in the prefetch buffer starts only if its lease
    // still holds and no cancel came meanwhile.
    let stopped = Stopped {
        cancelled: watch.cancelled(),
        lease_lost: lost.is_cancelled() && !ctx.abort.is_cancelled(),
    };
    if stopped.cancelled || stopped.lease_lost {
        let resolution = choose(&claimed.job, stopped, Run::NotStarted, &ctx.config);
        return (resolution, None, Duration::ZERO);
    }
    let handler = match ctx.precheck(claimed) {
        Ok(handler) => handler,
        Err(resolution) => return (resolution, None, Duration::ZERO),
    };
    if claimed.suspect {
        // It may be the job that kills its workers: the outcomes of runs
        // that ended before it are written first, so a crash it causes
        // cannot send them to the rescuer (and charge them again). Bounded
        // by the lease: a completer that cannot write holds no one up.
        let _ = tokio::time::timeout(ctx.config.lease_duration, ctx.lease.book.outcomes_written())
            .await;
    }
    let job = &claimed.job;
    // Stops on a lost lease, shutdown past the grace period, or a cancel
    // (the watch was taken at claim time). The timeout counts from here,
    // not from the claim.
    let deadline = Deadline::new(ctx.timeout_of(job));
    let gauge =
        ::metrics::gauge!(metrics::JOBS_IN_FLIGHT, "queue" => metrics::queue_label(&job.queue));
    gauge.increment(1.0);
    let progress = crate::progress::Reporter::new(
        ctx.progress.clone(),
        job.id,
        crate::progress::Run::Lease(claimed.token),
    );
    let (span, trace) = crate::claim::run::trace::run_span(claimed);
    let job_ctx = JobContext {
        transaction: None,
        pool: &ctx.pool,
        cancel: watch.token().child_token(),
        deadline: &deadline,
        admitted_at: claimed.admitted_at,
        keys: &claimed.keys,
        progress: &progress,
        steps: crate::steps::Steps::new(job.id, job.attempt, Some(claimed.token)),
        trace,
        inputs: claimed.inputs.clone(),
    };
    let (ended, _, duration) = execute(handler.as_ref(), job, job_ctx, watch.token(), span).await;
    crate::claim::run::trace::run_ended(claimed);
    gauge.decrement(1.0);
    let result = ctx.result_of(&ended);
    let stopped = Stopped {
        // Its cancel was requested: the completer buries it as cancelled,
        // fenced by its token, now that the run has stopped (never before:
        // a `dead retry` must not find it in dead_jobs while it runs).
        cancelled: watch.cancelled(),
        // Interrupted while the worker is not aborting: only the lease's
        // loss interrupts a run then.
        lease_lost: !ctx.abort.is_cancelled(),
    };
    let resolution = choose(job, stopped, Run::Ended(ended), &ctx.config);
    (resolution, result, duration)
}

/// The heartbeat service: renews every lease this worker holds in one
/// statement every third of the lease, and stops runs whose lease is lost
/// or could not be renewed in time. Runs until `stop`.
pub(crate) async fn heartbeat(ctx: Arc<ClaimContext>, stop: CancellationToken) {
    let lease = ctx.config.lease_duration;
    // Two loops at once: a renewal that hangs (a black-holed connection)
    // must not hold up the checks that stop runs whose lease runs out.
    let watchdog = async {
        let check = (lease / 12).max(Duration::from_millis(50));
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(check) => {}
            }
            let stopped = ctx.lease.book.stop_unsecured(stop_margin(lease));
            if stopped > 0 {
                tracing::error!(
                    jobs = stopped,
                    "leases not renewed in time (the database unreachable, or this process paused or starved of CPU): stopped their runs before the leases end; other workers will run them"
                );
            }
        }
    };
    let renewals = async {
        let every = lease / 3;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let tokens = ctx.lease.book.tokens();
            if tokens.is_empty() {
                continue;
            }
            let sent = Instant::now();
            let renewal = tokio::time::timeout(every, renew(&ctx, &tokens)).await;
            match renewal.unwrap_or(Err(Error::ConnectionLost("heartbeat timed out"))) {
                Ok((renewed, held)) => {
                    let lost = ctx
                        .lease
                        .book
                        .renewed(&tokens, &renewed, &held, sent, lease);
                    if lost > 0 {
                        tracing::warn!(
                            jobs = lost,
                            "leases lost (expired and rescued): stopping those runs"
                        );
                    }
                }
                // The database may be briefly away; the watchdog stops the
                // runs whose lease could end unrenewed.
                Err(e) => tracing::warn!(error = %e, "lease heartbeat failed"),
            }
        }
    };
    tokio::join!(watchdog, renewals);
}

/// Renew `tokens`: returns those renewed and those held but not renewed
/// (their rows were locked, e.g. by an outcome write in flight).
async fn renew(ctx: &ClaimContext, tokens: &[i64]) -> Result<(Vec<i64>, Vec<i64>)> {
    let mut conn = PooledConn::get(&ctx.pool, "heartbeat: no connection").await?;
    let r = Db::pooled(&conn, ctx.config.prepared_statements)
        .query(
            &HEARTBEAT,
            &[&tokens, &ctx.config.lease_duration.as_secs_f64()],
        )
        .await;
    let rows = conn.check(r).map_err(Error::db("heartbeat"))?;
    let (renewed, held): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.get::<_, bool>(1));
    Ok((
        renewed.iter().map(|r| r.get(0)).collect(),
        held.iter().map(|r| r.get(0)).collect(),
    ))
}
