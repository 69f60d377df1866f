//! `tx` delivery mode: the claim transaction stays open while the batch's
//! handlers run (docs/src/delivery.md; ARCHITECTURE.md, "tx mode").
//!
//! ```text
//!  BEGIN; SET LOCAL limits; DELETE … SKIP LOCKED RETURNING;
//!    (no pressure) the crash check: every mark read                      one round trip
//!  mark the batch in pgwake.tx_batches (other connection, one statement;
//!    under pressure, unless a job is a suspect: marks looked up by job)
//!  any suspect? ── yes ──▶ ROLLBACK; run each suspect alone (below)
//!  for each job, in claim order:  handler [lazy SAVEPOINT … RELEASE | ROLLBACK TO]
//!  write requeues and buries (savepoint; per-job fallback), clear the mark; COMMIT
//!
//!  suspect (alone): BEGIN; claim it by id; charge it in pgwake.tx_attempts
//!                   (durable); run; outcome + clear charges; COMMIT
//! ```
//!
//! - success: the DELETE commits with whatever the handler wrote;
//! - failure: rolled back to the job's savepoint (its siblings keep their
//!   work) and put back with the attempt counted, or buried at
//!   `max_attempts`;
//! - crash / lost connection: the server rolls the batch back and its jobs
//!   are claimable at once. The batch's mark outlives its transaction, so the
//!   next claim of any of its jobs finds it a suspect: suspects run one at a
//!   time, each charged an attempt before it starts. A job that crashes its
//!   worker (or its server session) uses up its own attempts and ends dead;
//!   its batch siblings are never charged for it.
//!
//! Batches are sized by time ([`BatchSizer`]): a batch grows while it
//! finishes within [`TX_BATCH_TARGET`] and shrinks to fit it, so slow jobs
//! run one per transaction and never wait behind their siblings.
//!
//! Any error before COMMIT drops the connection instead of returning it to
//! the pool, so no pooled connection is ever left idle in a transaction.
//!
//! May import [`choose`](super::choose), [`outcome`](super::outcome),
//! [`run`](super::run) and the claim context; never
//! [`lease`](super::lease).

use std::time::Instant;

use deadpool_postgres::Object;

use crate::claim::choose::plan::{ClaimSpec, Target, Targets};
use crate::claim::choose::targets::{Settled, Walk};
use crate::claim::choose::wake::Trigger;
use crate::claim::context::ClaimContext;
use crate::claim::run::claimed::{sort_claim_order, Claimed};
use crate::claim::run::row::{ClaimRow, Mode};
use crate::error::{Error, Result};
use crate::metrics;

use crate::db::sql::{
    Db, CLAIM_TX_ALL as CLAIM_ALL, CLAIM_TX_ALL_AFTER as CLAIM_ALL_AFTER,
    CLAIM_TX_LIMITED as CLAIM_LIMITED, CLAIM_TX_QUEUE as CLAIM_QUEUE,
    CLAIM_TX_QUEUE_AFTER as CLAIM_QUEUE_AFTER, SUSPECTS,
};

pub(crate) mod ahead;
mod ledger;
pub(crate) mod mark;
mod run;
mod sizer;
pub(crate) mod state;
mod write;

use ledger::{mark_batch, run_suspects, Marked, UnslottedKeys};
use run::{run_batch, Session};
pub(crate) use sizer::{batch_limit, BatchSizer};
pub use sizer::{TX_BATCH_TARGET, TX_BATCH_UNDER_PRESSURE};
use write::finish;

/// The claim transaction's opening statements.
pub(crate) fn begin_sql(config: &crate::config::WorkerConfig) -> String {
    format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}; SET LOCAL statement_timeout = {}",
        config.idle_in_transaction_timeout().as_millis(),
        config.idle_in_transaction_timeout().as_millis()
    )
}

/// A pooled connection with an open transaction. Dropped without
/// [`OpenTx::release`], it closes the connection (the server rolls back)
/// rather than returning it to the pool mid-transaction: this is what makes
/// a claim future cancelled at any await point lose nothing.
pub(super) struct OpenTx {
    conn: Option<Object>,
}

impl OpenTx {
    fn conn(&self) -> &Object {
        self.conn.as_ref().expect("connection present until drop")
    }

    /// The transaction is closed: the connection may go back to the pool.
    fn release(mut self) {
        self.conn.take();
    }
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(Object::take(conn));
        }
    }
}

/// What a tx claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TxClaim {
    /// Jobs claimed (suspects included).
    pub claimed: usize,
    /// It found nothing and claims once more for a claim of this worker
    /// that found nothing beside it (`choose/overlap.rs`).
    pub again: bool,
}

impl TxClaim {
    /// `claimed` jobs claimed and run.
    fn ran(claimed: usize) -> TxClaim {
        TxClaim {
            claimed,
            again: false,
        }
    }
}

/// Claim up to `limit` jobs for `spec` and run them.
pub(crate) async fn claim_and_run(
    ctx: &ClaimContext,
    spec: &ClaimSpec,
    limit: usize,
    sizer: &mut BatchSizer,
    trigger: Trigger,
) -> Result<TxClaim> {
    let conn = ctx
        .pool
        .get()
        .await
        .map_err(Error::pool("claim: no connection"))?;
    let targets = ctx.targets(spec).await?;
    let tx = OpenTx { conn: Some(conn) };
    let c = tx.conn();
    let db = Db::pooled(c, ctx.config.prepared_statements);
    let limit = limit as i64;
    // In flight until the claim's transaction has ended, or its jobs are
    // claimed (choose/overlap.rs).
    let in_flight = ctx.choice.overlap.begin();
    let Taken {
        rows,
        suspects,
        settled,
        claim_sent,
        by_job,
    } = take(ctx, spec, &targets, c, limit).await?;
    let limited = matches!(settled.tried, Some(Target::Limited(_) | Target::Rated(..)));
    let hit = if rows.is_empty() { "empty" } else { "hit" };
    ::metrics::counter!(metrics::CLAIMS, "trigger" => trigger.as_str(), "result" => hit, "mode" => "tx")
        .increment(1);
    if rows.is_empty() {
        c.batch_execute("COMMIT")
            .await
            .map_err(Error::db("claim: commit"))?;
        tx.release();
        return Ok(TxClaim {
            claimed: 0,
            again: in_flight.end(false),
        });
    }
    in_flight.end(true);
    let first_row = ClaimRow::read(&rows[0], Mode::Tx);
    let xid = first_row.xid();
    let backend_pid = first_row.backend_pid();
    let count = rows.len();
    let suspect_ids: std::collections::HashSet<i64> =
        suspects.iter().map(|r| r.get::<_, i64>(0)).collect();
    let suspects: Vec<i64> = rows
        .iter()
        .map(|r| ClaimRow::read(r, Mode::Tx).id())
        .filter(|id| suspect_ids.contains(id))
        .collect();
    if !suspects.is_empty() {
        return give_back_and_run_alone(ctx, tx, suspects, count)
            .await
            .map(TxClaim::ran);
    }
    if count as i64 == limit || limited {
        // There is likely more: let one more task help drain. A limited
        // queue's claim takes one job per transaction (claim_tx_limited.sql),
        // so it is full at one.
        ctx.wake.wake_one(Trigger::Drain);
    }
    let claimed = claimed_jobs(ctx, db, &rows, &settled, claim_sent).await;
    let mark = match mark_claimed(ctx, &rows, &claimed, &xid, limited, by_job).await? {
        Marked::Mark(mark) => mark,
        Marked::Suspects(suspects) => {
            return give_back_and_run_alone(ctx, tx, suspects, count)
                .await
                .map(TxClaim::ran);
        }
    };

    let started = Instant::now();
    let token = mark.token;
    let mark = std::sync::Arc::new(mark);
    let mut session = Session {
        last_sent: Instant::now(),
        limits_for: Some(ctx.config.job_timeout),
        backend_pid,
        xid: parse_xid(&xid),
        mark: Some(mark.clone()),
    };
    let results = run_batch(ctx, c, claimed, &mut session).await?;
    ctx.tx
        .marks_durable
        .store(mark.reached(), std::sync::atomic::Ordering::Relaxed);
    sizer.observe(count, started.elapsed());
    finish(ctx, db, &results, Some(token), None).await?;
    tx.release();
    for r in results {
        ctx.report(&r.claimed, r.resolution, r.duration);
    }
    Ok(TxClaim::ran(count))
}

/// What a claim transaction's statements took, before anything ran.
struct Taken<'a> {
    /// The claimed rows.
    rows: Vec<tokio_postgres::Row>,
    /// The crash check's rows (ids of jobs that an earlier batch's mark
    /// names); empty under pressure, where the mark checks by job.
    suspects: Vec<tokio_postgres::Row>,
    /// What the walk's last claim ran on, and its admissions.
    settled: Settled<'a>,
    /// When the first claim was sent.
    claim_sent: Instant,
    /// Under pressure: the crash check is made by job, in the mark's own
    /// statement.
    by_job: bool,
}

/// BEGIN on `c`, the claims of `spec` over `targets` up to `limit` jobs,
/// and the crash check.
async fn take<'a>(
    ctx: &'a ClaimContext,
    spec: &'a ClaimSpec,
    targets: &'a Targets,
    c: &Object,
    limit: i64,
) -> Result<Taken<'a>> {
    let db = Db::pooled(c, ctx.config.prepared_statements);
    let except = &targets.except[..];
    // Pipelined: BEGIN, the first claim and (without pressure) the crash
    // check go out together. Queues are tried in turn (a scalar
    // `queue = $2` is an ordered index scan) until one has jobs.
    // A rate-limited queue's admissions are committed first (targets.rs).
    let mut walk = ctx.walk(spec, &targets.queues, limit);
    let head_every = ctx.pressure_throttle();
    let claim_cursor = crate::claim::choose::cursor::CursorUse {
        cursors: &ctx.choice.claim_cursors,
        head_every,
    };
    // Under pressure the crash check is made by job, in the mark's own
    // statement (ledger.rs): a held horizon keeps every finished batch's
    // dead mark, which the whole-table read below would walk.
    let by_job = head_every.is_some();
    let suspects_now = async || {
        if by_job {
            Ok(Vec::new())
        } else {
            db.query(&SUSPECTS, &[]).await
        }
    };
    let first_target = walk
        .next()
        .await?
        .expect("a claim spec has at least one target");
    // `biased`: polled in this order every time, so each request goes out
    // in this order even when a cached statement first waits for its
    // Prepare (the default rotates the first future polled, and could send
    // the claim before the BEGIN, or the check before the claim, on a
    // fresh connection).
    let claim_sent = Instant::now();
    let (begun, first, suspects) = tokio::join!(
        biased;
        c.batch_execute(&ctx.tx.begin_sql),
        claim_rows(
            db,
            limit,
            first_target,
            except,
            spec,
            &walk,
            &ctx.choice.key_cursors,
            &ctx.choice.key_repairs,
            claim_cursor,
        ),
        suspects_now(),
    );
    begun.map_err(Error::db("claim: begin"))?;
    let mut rows = first.map_err(Error::db("claim"))?;
    let mut suspects = suspects.map_err(Error::db("claim: suspects"))?;
    let first_claim = rows.len();
    // Fill the batch across plain queues (targets.rs): a limited queue is
    // claimed only by a round that found nothing before it, and ends it.
    let mut stop = !rows.is_empty() && !Walk::fills_with(first_target);
    while !stop && (rows.len() as i64) < limit {
        match walk.peek() {
            None => break,
            Some(next) if !rows.is_empty() && !Walk::fills_with(next) => break,
            Some(_) => {}
        }
        let Some(queue) = walk.next().await? else {
            break;
        };
        let more = claim_rows(
            db,
            limit - rows.len() as i64,
            queue,
            except,
            spec,
            &walk,
            &ctx.choice.key_cursors,
            &ctx.choice.key_repairs,
            claim_cursor,
        )
        .await
        .map_err(Error::db("claim"))?;
        stop = !more.is_empty() && !Walk::fills_with(queue);
        rows.extend(more);
    }
    if rows.len() > first_claim {
        // Later claims locked more rows: check again, after them.
        suspects = suspects_now().await.map_err(Error::db("claim: suspects"))?;
    }
    let used: Vec<Option<&str>> = rows
        .iter()
        .map(|r| ClaimRow::read(r, Mode::Tx).limit_key())
        .collect();
    let settled = walk.settle(&used).await?;
    Ok(Taken {
        rows,
        suspects,
        settled,
        claim_sent,
        by_job,
    })
}

/// The claimed rows as jobs, in claim order, this run's attempt counted
/// and (when the worker traces jobs) their traces attached.
async fn claimed_jobs(
    ctx: &ClaimContext,
    db: Db<'_>,
    rows: &[tokio_postgres::Row],
    settled: &Settled<'_>,
    claim_sent: Instant,
) -> Vec<Claimed> {
    let mut claimed: Vec<Claimed> = rows
        .iter()
        .map(|row| {
            let mut c = ClaimRow::read(row, Mode::Tx).claimed();
            c.admitted_at = settled.admitted_at(c.keys.limit_key.is_some());
            c
        })
        .collect();
    for c in &mut claimed {
        c.job.attempt += 1;
    }
    sort_claim_order(&mut claimed);
    if ctx.config.trace_jobs {
        crate::claim::run::trace::attach(db, &mut claimed, claim_sent, "tx").await;
    }
    claimed
}

/// Mark the batch of transaction `xid` (ledger.rs): its jobs, and those
/// that hold no queue slot or key slot (`limited`: the claim was from a
/// limited or rate-limited queue).
async fn mark_claimed(
    ctx: &ClaimContext,
    rows: &[tokio_postgres::Row],
    claimed: &[Claimed],
    xid: &str,
    limited: bool,
    by_job: bool,
) -> Result<Marked> {
    let ids: Vec<i64> = claimed.iter().map(|c| c.job.id).collect();
    // A plain claim's jobs hold no queue slot (their queue had no limit); a
    // limited claim says whether it took one (claim_tx_limited.sql, the
    // column after the keys). Jobs without a slot are named in the mark, so
    // that a limit set while they run counts them.
    let holds_slot = limited && ClaimRow::read(&rows[0], Mode::Tx).holds_slot();
    let queues = (!holds_slot).then(|| claimed.iter().map(|c| c.job.queue.clone()).collect());
    // Likewise per key (migration 0022): a job with a limit key that took
    // no key slot (the column after the queue slot's) is named in the
    // mark, so that a per-key limit set while it runs counts it.
    let key_slots: std::collections::HashSet<i64> = if limited {
        rows.iter()
            .map(|r| ClaimRow::read(r, Mode::Tx))
            .filter(|r| r.holds_key_slot())
            .map(|r| r.id())
            .collect()
    } else {
        Default::default()
    };
    let unslotted_keys = UnslottedKeys::of(
        claimed
            .iter()
            .filter(|c| !key_slots.contains(&c.job.id))
            .filter_map(|c| Some((c.job.queue.as_str(), c.keys.limit_key.as_deref()?))),
    );
    mark_batch(ctx, xid, &ids, queues, unslotted_keys, by_job).await
}

/// Some of a claim's jobs are suspects and nothing has run: give every job
/// back and run the suspects alone (`count`: the claim's size, returned).
async fn give_back_and_run_alone(
    ctx: &ClaimContext,
    tx: OpenTx,
    suspects: Vec<i64>,
    count: usize,
) -> Result<usize> {
    tx.conn()
        .batch_execute("ROLLBACK")
        .await
        .map_err(Error::db("claim: rollback"))?;
    tx.release();
    run_suspects(ctx, suspects).await?;
    Ok(count)
}

/// One claim statement, over every queue but `except` or from `queue`
/// (within the rate admissions and per-key admissions `walk` took for it,
/// if any; a fair-keys queue's rotation continuing from `cursors`, which it
/// moves on; the keys it reports with slot rows missing go to `repairs`).
#[allow(clippy::too_many_arguments)]
pub(super) async fn claim_rows(
    c: Db<'_>,
    limit: i64,
    target: &Target,
    except: &[String],
    spec: &ClaimSpec,
    walk: &Walk<'_>,
    cursors: &crate::claim::choose::key_rotation::KeyCursors,
    repairs: &crate::claim::choose::key_repair::KeyRepairs,
    claim_cursor: crate::claim::choose::cursor::CursorUse<'_>,
) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    let (admission, admitted_keys) = (walk.admission(), walk.admitted_keys());
    match target {
        // Under pressure, after the last job claimed (cursor.rs).
        Target::All => {
            claim_cursor
                .cursors
                .claim(
                    c,
                    spec,
                    None,
                    claim_cursor.head_every,
                    Mode::Tx,
                    (&CLAIM_ALL, &CLAIM_ALL_AFTER),
                    &[&limit, &except, &spec.tasks_in, &spec.tasks_not_in],
                )
                .await
        }
        Target::Queue(q) => {
            claim_cursor
                .cursors
                .claim(
                    c,
                    spec,
                    Some(q),
                    claim_cursor.head_every,
                    Mode::Tx,
                    (&CLAIM_QUEUE, &CLAIM_QUEUE_AFTER),
                    &[&limit, q, &spec.tasks_in, &spec.tasks_not_in],
                )
                .await
        }
        Target::Limited(q) | Target::Rated(q, _) => {
            if admission.is_some_and(|a| a.none()) {
                return Ok(Vec::new());
            }
            let cap = admission.and_then(|a| a.cap());
            let after = cursors.after(q);
            let rows = c
                .query(
                    &CLAIM_LIMITED,
                    &[
                        &limit,
                        q,
                        &spec.tasks_in,
                        &spec.tasks_not_in,
                        &cap,
                        &after,
                        &admitted_keys,
                    ],
                )
                .await?;
            // Keys reported for a repair.
            let (rows, stop) = repairs.take_reports(q, rows, Mode::Tx);
            walk.served(
                q,
                after.as_deref(),
                rows.iter().map(|r| ClaimRow::read(r, Mode::Tx).limit_key()),
                stop.as_deref(),
            );
            Ok(rows)
        }
    }
}

/// A claim's transaction id, as the claim returns it (`xid8` as text).
/// An xid8 is below 2^63 for as long as any server runs.
pub(super) fn parse_xid(xid: &str) -> i64 {
    xid.parse().unwrap_or_else(|e| {
        tracing::warn!(xid, error = %e, "a claim transaction id that is not a number: its jobs' progress will not be shown");
        0
    })
}
