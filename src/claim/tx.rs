//! `tx` delivery mode: the claim transaction stays open while the batch's
//! handlers run (DESIGN.md §2).
//!
//! ```text
//!  BEGIN; SET LOCAL limits; DELETE … SKIP LOCKED RETURNING (+ suspects)   one round trip
//!  any suspect? ── yes ──▶ ROLLBACK; run each suspect alone (below)
//!  mark the batch in pgwake.tx_batches (other connection, durable)
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

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::Object;
use tokio_postgres::types::ToSql;

use crate::claim::claimed::{
    claimed_from_row, keys_from_row, sort_claim_order, Claimed, CLAIM_COLUMNS,
};
use crate::claim::context::ClaimContext;
use crate::claim::executor::{execute, Ended};
use crate::claim::outcome::{write_of, Finished, Write};
use crate::claim::plan::{ClaimSpec, Target};
use crate::claim::targets::Walk;
use crate::claim::wake::Trigger;
use crate::error::{Error, Result};
use crate::handler::{ClaimTx, Deadline, Delivery, JobContext};
use crate::job::{Job, Resolution};
use crate::metrics;

use crate::db::sql::{
    Db, ADOPT_STALE, BATCH_CLEAR, BATCH_MARK, BURY, CANCEL_BACKEND, CHARGE,
    CLAIM_TX_ALL as CLAIM_ALL, CLAIM_TX_LIMITED as CLAIM_LIMITED, CLAIM_TX_ONE as CLAIM_ONE,
    CLAIM_TX_QUEUE as CLAIM_QUEUE, CLEAR_ATTEMPTS, HISTORY_DONE, REQUEUE, SET_LIMITS, SUSPECTS,
};

/// How long a tx-mode batch should take to run. Batches grow (doubling, up
/// to `--batch`) while they finish faster and shrink to fit it, so a batch
/// pins the vacuum horizon and holds back its later jobs for about this
/// long at most, and slow jobs run one per transaction.
pub const TX_BATCH_TARGET: Duration = Duration::from_millis(100);

/// How often a running tx-mode job checks that its claim connection is alive.
const CONNECTION_CHECK: Duration = Duration::from_millis(20);

/// The claim transaction's opening statements.
pub(crate) fn begin_sql(config: &crate::config::WorkerConfig) -> String {
    format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}; SET LOCAL statement_timeout = {}",
        config.idle_in_transaction_timeout().as_millis(),
        config.idle_in_transaction_timeout().as_millis()
    )
}

/// Batch size by time (see [`TX_BATCH_TARGET`]); one per claim task.
#[derive(Debug)]
pub(crate) struct BatchSizer {
    size: usize,
    max: usize,
}

impl BatchSizer {
    /// Starts at one job: the first batch of unknown jobs must not be a long
    /// one.
    pub(crate) fn new(max: usize) -> BatchSizer {
        BatchSizer { size: 1, max }
    }

    /// Starts (and may stay) at `max`.
    pub(crate) fn at(max: usize) -> BatchSizer {
        BatchSizer { size: max, max }
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    fn observe(&mut self, claimed: usize, ran_for: Duration) {
        if claimed == 0 {
            return;
        }
        if ran_for > TX_BATCH_TARGET {
            let fit = claimed as f64 * TX_BATCH_TARGET.as_secs_f64() / ran_for.as_secs_f64();
            self.size = (fit as usize).clamp(1, self.max);
        } else if claimed >= self.size {
            self.size = (self.size * 2).min(self.max);
        }
    }
}

/// A pooled connection with an open transaction. Dropped without
/// [`OpenTx::release`], it closes the connection (the server rolls back)
/// rather than returning it to the pool mid-transaction: this is what makes
/// a claim future cancelled at any await point lose nothing.
struct OpenTx {
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

/// State of the claim connection across a batch.
struct Session {
    /// When we last sent a statement (the server's idle clock restarts).
    last_sent: Instant,
    /// The job timeout the server-side limits currently cover.
    limits_for: Option<Duration>,
    /// The claim connection's server process (to cancel a timed-out query).
    backend_pid: i32,
}

/// Claim up to `limit` jobs for `spec` and run them; returns how many were
/// claimed (suspects included).
pub(crate) async fn claim_and_run(
    ctx: &ClaimContext,
    spec: &ClaimSpec,
    limit: usize,
    sizer: &mut BatchSizer,
    trigger: Trigger,
) -> Result<usize> {
    let conn = ctx
        .pool
        .get()
        .await
        .map_err(Error::pool("claim: no connection"))?;
    let targets = ctx.targets(spec).await?;
    let (queues, except) = (&targets.queues, &targets.except[..]);
    let tx = OpenTx { conn: Some(conn) };
    let c = tx.conn();
    let db = Db::pooled(c, ctx.config.prepared_statements);
    let limit = limit as i64;
    // Pipelined: BEGIN, the first claim and the suspects check go out
    // together. Queues are tried in turn (a scalar `queue = $2` is an
    // ordered index scan) until one has jobs.
    // A rate-limited queue's admissions are committed first (targets.rs).
    let mut walk = Walk::new(ctx, queues, limit);
    let first = walk
        .next()
        .await?
        .expect("a claim spec has at least one target");
    let (begun, first, suspects) = tokio::join!(
        c.batch_execute(&ctx.begin_sql),
        claim_rows(db, limit, first, except, spec, walk.admission()),
        db.query(&SUSPECTS, &[])
    );
    begun.map_err(Error::db("claim: begin"))?;
    let mut rows = first.map_err(Error::db("claim"))?;
    let mut suspects = suspects.map_err(Error::db("claim: suspects"))?;
    while rows.is_empty() {
        let Some(queue) = walk.next().await? else {
            break;
        };
        rows = claim_rows(db, limit, queue, except, spec, walk.admission())
            .await
            .map_err(Error::db("claim"))?;
        if !rows.is_empty() {
            suspects = db
                .query(&SUSPECTS, &[])
                .await
                .map_err(Error::db("claim: suspects"))?;
        }
    }
    let (tried, admitted_at) = walk.settle(rows.len()).await?;
    let limited_hit =
        !rows.is_empty() && matches!(tried, Some(Target::Limited(_) | Target::Rated(_)));
    let hit = if rows.is_empty() { "empty" } else { "hit" };
    ::metrics::counter!(metrics::CLAIMS, "trigger" => trigger.as_str(), "result" => hit, "mode" => "tx")
        .increment(1);
    if rows.is_empty() {
        c.batch_execute("COMMIT")
            .await
            .map_err(Error::db("claim: commit"))?;
        tx.release();
        return Ok(0);
    }
    let xid: String = rows[0].get(CLAIM_COLUMNS);
    let backend_pid: i32 = rows[0].get(CLAIM_COLUMNS + 1);
    let suspect_ids: std::collections::HashSet<i64> =
        suspects.iter().map(|r| r.get::<_, i64>(0)).collect();
    let suspects: Vec<i64> = rows
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .filter(|id| suspect_ids.contains(id))
        .collect();
    let count = rows.len();
    if !suspects.is_empty() {
        // Nothing has run: give every job back and run the suspects alone.
        c.batch_execute("ROLLBACK")
            .await
            .map_err(Error::db("claim: rollback"))?;
        tx.release();
        run_suspects(ctx, suspects).await?;
        return Ok(count);
    }
    if count as i64 == limit || limited_hit {
        // There is likely more: let one more task help drain. A limited
        // queue's claim takes one job per transaction (claim_tx_limited.sql),
        // so it is full at one.
        ctx.wake.wake_one(Trigger::Drain);
    }
    let mut claimed: Vec<Claimed> = rows
        .iter()
        .map(|row| Claimed {
            keys: keys_from_row(row, CLAIM_COLUMNS + 2),
            admitted_at,
            ..claimed_from_row(row)
        })
        .collect();
    for c in &mut claimed {
        c.job.attempt += 1;
    }
    sort_claim_order(&mut claimed);
    let ids: Vec<i64> = claimed.iter().map(|c| c.job.id).collect();
    let mark = mark_batch(ctx, &xid, &ids).await?;

    let started = Instant::now();
    let mut session = Session {
        last_sent: Instant::now(),
        limits_for: Some(ctx.config.job_timeout),
        backend_pid,
    };
    let results = run_batch(ctx, c, claimed, &mut session).await?;
    sizer.observe(count, started.elapsed());
    finish(ctx, db, &results, Some(mark), None).await?;
    tx.release();
    for r in results {
        ctx.report(&r.claimed.job, r.resolution, r.duration);
    }
    Ok(count)
}

/// One claim statement, over every queue but `except` or from `queue`
/// (within the rate `admission` taken for it, if any).
async fn claim_rows(
    c: Db<'_>,
    limit: i64,
    target: &Target,
    except: &[String],
    spec: &ClaimSpec,
    admission: Option<&crate::claim::rate::Admission>,
) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match target {
        Target::All => {
            c.query(
                &CLAIM_ALL,
                &[&limit, &except, &spec.tasks_in, &spec.tasks_not_in],
            )
            .await
        }
        Target::Queue(q) => {
            c.query(
                &CLAIM_QUEUE,
                &[&limit, q, &spec.tasks_in, &spec.tasks_not_in],
            )
            .await
        }
        Target::Limited(q) | Target::Rated(q) => {
            if admission.is_some_and(|a| a.none()) {
                return Ok(Vec::new());
            }
            let cap = admission.and_then(|a| a.cap());
            c.query(
                &CLAIM_LIMITED,
                &[&limit, q, &spec.tasks_in, &spec.tasks_not_in, &cap],
            )
            .await
        }
    }
}

/// Durably record "transaction `xid` holds `ids`" before any handler runs.
async fn mark_batch(ctx: &ClaimContext, xid: &str, ids: &[i64]) -> Result<i64> {
    let mut conn = crate::db::connect::PooledConn::get(
        &ctx.ledger_pool,
        "claim: no connection to mark the batch",
    )
    .await?;
    let r = Db::pooled(&conn, ctx.config.prepared_statements)
        .query_one(&BATCH_MARK, &[&xid, &ids, &ctx.worker_id])
        .await;
    Ok(conn
        .check(r)
        .map_err(Error::db("claim: mark batch"))?
        .get(0))
}

/// Run each suspect alone, charged before it starts.
async fn run_suspects(ctx: &ClaimContext, ids: Vec<i64>) -> Result<()> {
    {
        let mut conn =
            crate::db::connect::PooledConn::get(&ctx.ledger_pool, "claim: no connection to adopt")
                .await?;
        let r = Db::unnamed(&conn).query_one(&ADOPT_STALE, &[]).await;
        let adopted: i64 = conn.check(r).map_err(Error::db("claim: adopt"))?.get(0);
        if adopted > 0 {
            tracing::warn!(
                batches = adopted,
                "found batches that never reported (a worker or its database session crashed while running them); their jobs now run one at a time"
            );
        }
    }
    for id in ids {
        if ctx.stop.is_cancelled() {
            break;
        }
        run_suspect(ctx, id).await?;
    }
    Ok(())
}

async fn run_suspect(ctx: &ClaimContext, id: i64) -> Result<()> {
    let conn = ctx
        .pool
        .get()
        .await
        .map_err(Error::pool("claim: no connection"))?;
    let tx = OpenTx { conn: Some(conn) };
    let c = tx.conn();
    let db = Db::pooled(c, ctx.config.prepared_statements);
    // Its queue may be rate-limited: one admission, committed first
    // (rate.rs); given back if the job is not claimed.
    let admission = crate::claim::rate::reserve_on_own(ctx, None, Some(id), 1).await?;
    let admitted = !admission.none();
    let params: [&(dyn ToSql + Sync); 2] = [&id, &admitted];
    let (begun, rows) = tokio::join!(
        c.batch_execute(&ctx.begin_sql),
        db.query(&CLAIM_ONE, &params)
    );
    begun.map_err(Error::db("claim: begin"))?;
    let rows = rows.map_err(Error::db("claim"))?;
    crate::claim::rate::settle(ctx, Some(&admission), rows.len()).await?;
    let Some(row) = rows.first() else {
        // Taken by another worker meanwhile, or not due.
        c.batch_execute("COMMIT")
            .await
            .map_err(Error::db("claim: commit"))?;
        tx.release();
        return Ok(());
    };
    let mut claimed = Claimed {
        keys: keys_from_row(row, CLAIM_COLUMNS + 2),
        admitted_at: admission.admitted(),
        ..claimed_from_row(row)
    };
    let backend_pid: i32 = row.get(CLAIM_COLUMNS + 1);
    let charged: i32 = {
        let mut conn =
            crate::db::connect::PooledConn::get(&ctx.ledger_pool, "claim: no connection to charge")
                .await?;
        let r = Db::pooled(&conn, ctx.config.prepared_statements)
            .query_one(&CHARGE, &[&id])
            .await;
        conn.check(r).map_err(Error::db("claim: charge"))?.get(0)
    };
    claimed.job.attempt += charged;
    tracing::info!(
        job = id,
        attempt = claimed.job.attempt,
        "running a job alone: an earlier run of its batch never reported"
    );
    let mut session = Session {
        last_sent: Instant::now(),
        limits_for: Some(ctx.config.job_timeout),
        backend_pid,
    };
    let results = run_batch(ctx, c, vec![claimed], &mut session).await?;
    finish(ctx, db, &results, None, Some(&[id])).await?;
    tx.release();
    for r in results {
        ctx.report(&r.claimed.job, r.resolution, r.duration);
    }
    Ok(())
}

/// Run a claimed batch in claim order: runs of one batching handler's task
/// at once ([`crate::Handler::handle_batch`]), every other job alone.
async fn run_batch(
    ctx: &ClaimContext,
    c: &Object,
    claimed: Vec<Claimed>,
    session: &mut Session,
) -> Result<Vec<Finished>> {
    let mut results = Vec::with_capacity(claimed.len());
    // Every job of the batch can be cancelled from the claim on, also while
    // it waits for its siblings (it then never starts).
    let mut watches: std::collections::HashMap<i64, crate::claim::cancels::Watch> = claimed
        .iter()
        .map(|c| (c.job.id, ctx.cancels.watch(c.job.id, &ctx.abort)))
        .collect();
    let mut rest = claimed.into_iter().peekable();
    while let Some(first) = rest.next() {
        let mut group = vec![first];
        let batching = ctx
            .precheck(&group[0])
            .map(|h| h.batches())
            .unwrap_or(false);
        if batching {
            while let Some(next) = rest.peek() {
                if next.job.task == group[0].job.task && ctx.precheck(next).is_ok() {
                    group.push(rest.next().expect("peeked"));
                } else {
                    break;
                }
            }
        }
        if group.len() > 1 {
            if let Some(done) = run_group(ctx, c, &group, session, &watches).await? {
                results.extend(done);
                continue;
            }
        }
        for claimed in group {
            let watch = watches
                .remove(&claimed.job.id)
                .unwrap_or_else(|| ctx.cancels.watch(claimed.job.id, &ctx.abort));
            let (resolution, result, duration) = run_one(ctx, c, &claimed, session, &watch).await?;
            results.push(Finished {
                claimed,
                resolution,
                result,
                duration,
            });
        }
    }
    Ok(results)
}

/// One statement for a group of jobs of a batching handler, in a savepoint.
/// `None` (everything it wrote rolled back) to run them one by one.
async fn run_group(
    ctx: &ClaimContext,
    c: &Object,
    group: &[Claimed],
    session: &mut Session,
    watches: &std::collections::HashMap<i64, crate::claim::cancels::Watch>,
) -> Result<Option<Vec<Finished>>> {
    let Ok(handler) = ctx.precheck(&group[0]) else {
        return Ok(None);
    };
    let jobs: Vec<Job> = group.iter().map(|c| c.job.clone()).collect();
    let timeout = group
        .iter()
        .map(|c| ctx.timeout_of(&c.job))
        .max()
        .unwrap_or(ctx.config.job_timeout);
    set_limits(
        Db::pooled(c, ctx.config.prepared_statements),
        session,
        timeout,
    )
    .await?;
    c.batch_execute("SAVEPOINT pgwake_batch")
        .await
        .map_err(Error::db("claim: savepoint"))?;
    let started = Instant::now();
    let run = tokio::time::timeout(timeout, handler.handle_batch(&jobs, c));
    let result = tokio::select! {
        r = run => r,
        () = connection_closed(c) => return Err(Error::ConnectionLost("claim connection closed while a handler ran; its claim was rolled back")),
    };
    let duration = started.elapsed();
    let outcomes = match result {
        Ok(Ok(Some(outcomes))) if outcomes.len() == group.len() => Some(outcomes),
        Err(_) => {
            cancel_backend(ctx, session.backend_pid).await;
            None
        }
        _ => None,
    };
    // A job of the group was cancelled meanwhile (one statement cannot be
    // stopped for one job): roll the group back; run one by one, the
    // cancelled jobs do not start.
    let cancelled = group
        .iter()
        .any(|c| watches.get(&c.job.id).is_some_and(|w| w.cancelled()));
    let outcomes = outcomes.filter(|_| !cancelled);
    let end = if outcomes.is_some() {
        "RELEASE SAVEPOINT pgwake_batch"
    } else {
        "ROLLBACK TO SAVEPOINT pgwake_batch"
    };
    c.batch_execute(end)
        .await
        .map_err(Error::db("claim: end of savepoint"))?;
    session.last_sent = Instant::now();
    let Some(outcomes) = outcomes else {
        return Ok(None);
    };
    let share = duration / group.len() as u32;
    Ok(Some(
        group
            .iter()
            .zip(outcomes)
            .map(|(claimed, outcome)| {
                let ended = Ended::Outcome(outcome);
                Finished {
                    claimed: claimed.clone(),
                    result: ctx.result_of(&ended),
                    resolution: ctx.resolve(&claimed.job, ended),
                    duration: share,
                }
            })
            .collect(),
    ))
}

/// The server's idle and statement limits cover a job of `timeout`, and
/// its idle clock has restarted recently enough for the job to run its
/// full time (a batch of jobs that never touch the connection must not be
/// cut off by a limit meant for one job).
async fn set_limits(db: Db<'_>, session: &mut Session, timeout: Duration) -> Result<()> {
    if session.limits_for != Some(timeout) {
        let ms = (timeout + crate::config::IDLE_TIMEOUT_MARGIN)
            .as_millis()
            .to_string();
        db.execute(&SET_LIMITS, &[&ms])
            .await
            .map_err(Error::db("claim: limits"))?;
        session.limits_for = Some(timeout);
        session.last_sent = Instant::now();
    } else if session.last_sent.elapsed() > crate::config::IDLE_TIMEOUT_MARGIN / 2 {
        db.client()
            .simple_query("")
            .await
            .map_err(Error::db("claim: keepalive"))?;
        session.last_sent = Instant::now();
    }
    Ok(())
}

/// Decide and run one job inside the claim transaction.
async fn run_one(
    ctx: &ClaimContext,
    c: &Object,
    claimed: &Claimed,
    session: &mut Session,
    watch: &crate::claim::cancels::Watch,
) -> Result<(Resolution, Option<String>, Duration)> {
    let job = &claimed.job;
    if watch.cancelled() {
        // Cancelled while it waited for its siblings: it never starts.
        return Ok((Resolution::Cancelled, None, Duration::ZERO));
    }
    let handler = match ctx.precheck(claimed) {
        Ok(handler) => handler,
        Err(resolution) => return Ok((resolution, None, Duration::ZERO)),
    };
    let timeout = ctx.timeout_of(job);
    set_limits(
        Db::pooled(c, ctx.config.prepared_statements),
        session,
        timeout,
    )
    .await?;
    let claim_tx = ClaimTx {
        client: c,
        savepoint: Default::default(),
    };
    let deadline = Deadline::new(timeout);
    // Fires on shutdown past the grace period and on a cancel request.
    let interrupt = watch.token();
    let gauge =
        ::metrics::gauge!(metrics::JOBS_IN_FLIGHT, "queue" => metrics::queue_label(&job.queue));
    gauge.increment(1.0);
    let job_ctx = JobContext {
        transaction: Some(&claim_tx),
        pool: &ctx.pool,
        cancel: interrupt.child_token(),
        deadline: &deadline,
        admitted_at: claimed.admitted_at,
    };
    let run = execute(handler.as_ref(), job, job_ctx, interrupt);
    // If the claim connection dies under a running handler (server restart,
    // pg_terminate_backend), the claim is already rolled back and another
    // worker may take the job: stop this run now rather than let it go on
    // beside the next one, and let the claim fail.
    let (ended, timed_out, duration) = tokio::select! {
        r = run => r,
        () = connection_closed(c) => {
            gauge.decrement(1.0);
            return Err(Error::ConnectionLost("claim connection closed while a handler ran; its claim was rolled back"));
        }
    };
    gauge.decrement(1.0);
    let used = claim_tx.savepoint.load(Ordering::Acquire);
    if deadline.at() > Instant::now() + timeout {
        // The handler extended its deadline (and the server's limits).
        session.limits_for = None;
    }
    let cancelled = watch.cancelled();
    if used && (timed_out.0 || cancelled) {
        // The handler's statement may still be running on the server: stop
        // it, or the savepoint rollback would wait behind it.
        cancel_backend(ctx, session.backend_pid).await;
    }
    let result = ctx.result_of(&ended);
    // A cancel wins over whatever the handler returned: nothing is
    // committed yet, so its work is rolled back with the savepoint below.
    let resolution = if cancelled {
        Resolution::Cancelled
    } else {
        ctx.resolve(job, ended)
    };
    if used {
        let sql = match resolution {
            Resolution::Done => "RELEASE SAVEPOINT pgwake_job",
            _ => "ROLLBACK TO SAVEPOINT pgwake_job",
        };
        c.batch_execute(sql)
            .await
            .map_err(Error::db("claim: end of savepoint"))?;
        session.last_sent = Instant::now();
    }
    Ok((resolution, result, duration))
}

/// Cancel whatever the claim connection's server process is running (a
/// timed-out handler's statement), from another connection.
async fn cancel_backend(ctx: &ClaimContext, pid: i32) {
    let result = async {
        let conn = ctx.pool.get().await.map_err(|e| e.to_string())?;
        Db::unnamed(&conn)
            .execute(&CANCEL_BACKEND, &[&pid])
            .await
            .map_err(|e| e.to_string())
    }
    .await;
    if let Err(e) = result {
        tracing::warn!(error = %e, "could not cancel a timed-out job's statement; the server's statement_timeout will");
    }
}

/// Columns of jobs being written back (requeue) or buried.
#[derive(Default)]
struct Columns {
    id: Vec<i64>,
    queue: Vec<String>,
    task: Vec<String>,
    payload: Vec<String>,
    priority: Vec<i32>,
    run_at: Vec<SystemTime>,
    delay: Vec<Option<f64>>,
    attempts: Vec<i32>,
    max_attempts: Vec<i32>,
    last_error: Vec<Option<String>>,
    created_at: Vec<SystemTime>,
    timeout: Vec<Option<f64>>,
    ordering_key: Vec<Option<String>>,
    unique_key: Vec<Option<String>>,
    ordering_at: Vec<Option<SystemTime>>,
}

impl Columns {
    fn push(&mut self, c: &Claimed, delay: Option<f64>, attempts: i32, last_error: Option<String>) {
        let job = &c.job;
        self.id.push(job.id);
        self.queue.push(job.queue.clone());
        self.task.push(job.task.clone());
        self.payload.push(job.payload_text.clone());
        self.priority.push(job.priority);
        self.run_at.push(job.run_at);
        self.delay.push(delay);
        self.attempts.push(attempts);
        self.max_attempts.push(job.max_attempts);
        self.last_error.push(last_error);
        self.created_at.push(job.created_at);
        self.timeout.push(job.timeout.map(|t| t.as_secs_f64()));
        self.ordering_key.push(c.keys.ordering_key.clone());
        self.unique_key.push(c.keys.unique_key.clone());
        self.ordering_at.push(c.keys.ordering_at);
    }

    fn is_empty(&self) -> bool {
        self.id.is_empty()
    }

    fn requeue_params(&self) -> [&(dyn ToSql + Sync); 15] {
        [
            &self.id,
            &self.queue,
            &self.task,
            &self.payload,
            &self.priority,
            &self.run_at,
            &self.delay,
            &self.attempts,
            &self.max_attempts,
            &self.last_error,
            &self.created_at,
            &self.timeout,
            &self.ordering_key,
            &self.unique_key,
            &self.ordering_at,
        ]
    }

    fn bury_params<'a>(&'a self, worker: &'a String) -> [&'a (dyn ToSql + Sync); 15] {
        [
            &self.id,
            &self.queue,
            &self.task,
            &self.payload,
            &self.priority,
            &self.run_at,
            &self.attempts,
            &self.max_attempts,
            &self.last_error,
            &self.created_at,
            &self.timeout,
            worker,
            &self.ordering_key,
            &self.unique_key,
            &self.ordering_at,
        ]
    }
}

/// Sort results into the rows to write back and to bury.
fn columns<'a>(results: impl Iterator<Item = (&'a Claimed, &'a Resolution)>) -> (Columns, Columns) {
    let mut back = Columns::default();
    let mut dead = Columns::default();
    for (c, resolution) in results {
        match write_of(c, resolution, Delivery::Tx) {
            Write::Done | Write::Nothing => {}
            Write::Back {
                delay,
                attempts,
                last_error,
            } => back.push(c, delay.map(|d| d.as_secs_f64()), attempts, last_error),
            Write::Dead { attempts, reason } => dead.push(c, None, attempts, Some(reason)),
        }
    }
    (back, dead)
}

/// Write every outcome and commit. An all-done batch commits in the same
/// round trip. Otherwise the outcome writes run in a savepoint first: if
/// they fail for a reason of data (never expected: reasons are sanitised,
/// delays bounded), each job's outcome is written alone, so one job's write
/// can never undo its siblings' work.
async fn finish(
    ctx: &ClaimContext,
    db: Db<'_>,
    results: &[Finished],
    mark: Option<i64>,
    clear: Option<&[i64]>,
) -> Result<()> {
    if ctx.history.on() {
        record_done(ctx, db, results).await?;
    }
    let worker = &ctx.worker_id;
    let (back, dead) = columns(results.iter().map(|r| (&r.claimed, &r.resolution)));
    let bookkeeping = async {
        if let Some(token) = mark {
            db.execute(&BATCH_CLEAR, &[&token]).await?;
        }
        if let Some(ids) = clear {
            db.execute(&CLEAR_ATTEMPTS, &[&ids]).await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    };
    let c = db.client();
    if back.is_empty() && dead.is_empty() {
        let (b, commit) = tokio::join!(bookkeeping, c.batch_execute("COMMIT"));
        b.and(commit).map_err(Error::db("claim: commit"))?;
        return Ok(());
    }
    c.batch_execute("SAVEPOINT pgwake_outcomes")
        .await
        .map_err(Error::db("claim: savepoint"))?;
    if let Err(e) = write_outcomes(db, worker, &back, &dead).await {
        if crate::error::pg_is_connection_lost(&e) {
            return Err(Error::db("claim: writing outcomes")(e));
        }
        tracing::error!(error = %crate::error::PgDisplay(&e), "writing a batch's outcomes failed; writing them one by one");
        c.batch_execute("ROLLBACK TO SAVEPOINT pgwake_outcomes")
            .await
            .map_err(Error::db("claim: writing outcomes"))?;
        for r in results {
            write_alone(db, worker, r).await?;
        }
    }
    let (b, commit) = tokio::join!(bookkeeping, c.batch_execute("COMMIT"));
    b.and(commit).map_err(Error::db("claim: commit"))?;
    Ok(())
}

/// Requeue `back` and bury `dead` (recording `worker`'s id with dead
/// jobs), pipelined.
async fn write_outcomes(
    db: Db<'_>,
    worker: &String,
    back: &Columns,
    dead: &Columns,
) -> std::result::Result<(), tokio_postgres::Error> {
    let requeue = async {
        if back.is_empty() {
            return Ok(0);
        }
        db.execute(&REQUEUE, &back.requeue_params()).await
    };
    let bury = async {
        if dead.is_empty() {
            return Ok(0);
        }
        db.execute(&BURY, &dead.bury_params(worker)).await
    };
    tokio::try_join!(requeue, bury).map(|_| ())
}

/// One job's outcome in its own savepoint; if even that fails, the job is
/// handed back unchanged (and if that fails too, the batch fails: every job
/// returns to the queue, nothing is lost).
async fn write_alone(db: Db<'_>, worker: &String, r: &Finished) -> Result<()> {
    if r.resolution == Resolution::Done {
        return Ok(());
    }
    let c = db.client();
    c.batch_execute("SAVEPOINT pgwake_outcome")
        .await
        .map_err(Error::db("claim: savepoint"))?;
    let (back, dead) = columns(std::iter::once((&r.claimed, &r.resolution)));
    if let Err(e) = write_outcomes(db, worker, &back, &dead).await {
        tracing::error!(job = r.claimed.job.id, error = %crate::error::PgDisplay(&e), "writing a job's outcome failed; handing it back unchanged");
        c.batch_execute("ROLLBACK TO SAVEPOINT pgwake_outcome")
            .await
            .map_err(Error::db("claim: writing outcomes"))?;
        let (back, dead) = columns(std::iter::once((&r.claimed, &Resolution::Returned)));
        write_outcomes(db, worker, &back, &dead)
            .await
            .map_err(Error::db("claim: handing a job back"))?;
    }
    c.batch_execute("RELEASE SAVEPOINT pgwake_outcome")
        .await
        .map_err(Error::db("claim: savepoint"))?;
    Ok(())
}

/// History on: record the batch's done jobs (with their results) in the
/// claim transaction, so they commit or roll back with the jobs' removal.
/// In a savepoint, pipelined with it: if a result cannot be stored (never
/// expected: results are scrubbed JSON), the rows are written again
/// without results, so a result can never cost the job its completion.
async fn record_done(ctx: &ClaimContext, db: Db<'_>, results: &[Finished]) -> Result<()> {
    let done: Vec<&Finished> = results
        .iter()
        .filter(|r| r.resolution == Resolution::Done)
        .collect();
    if done.is_empty() {
        return Ok(());
    }
    let ids: Vec<i64> = done.iter().map(|r| r.claimed.job.id).collect();
    let queues: Vec<&str> = done.iter().map(|r| r.claimed.job.queue.as_str()).collect();
    let tasks: Vec<&str> = done.iter().map(|r| r.claimed.job.task.as_str()).collect();
    let payloads: Vec<&str> = done
        .iter()
        .map(|r| r.claimed.job.payload_text.as_str())
        .collect();
    let attempts: Vec<i32> = done.iter().map(|r| r.claimed.job.attempt).collect();
    let created: Vec<SystemTime> = done.iter().map(|r| r.claimed.job.created_at).collect();
    let mut values: Vec<Option<&str>> = done.iter().map(|r| r.result.as_deref()).collect();
    let ordering_keys: Vec<Option<String>> = done
        .iter()
        .map(|r| r.claimed.keys.ordering_key.clone())
        .collect();
    let unique_keys: Vec<Option<String>> = done
        .iter()
        .map(|r| r.claimed.keys.unique_key.clone())
        .collect();
    let c = db.client();
    let params = |values: &[Option<&str>]| -> Vec<Box<dyn ToSql + Sync + Send>> {
        vec![
            Box::new(ids.clone()),
            Box::new(queues.iter().map(|q| q.to_string()).collect::<Vec<_>>()),
            Box::new(tasks.iter().map(|t| t.to_string()).collect::<Vec<_>>()),
            Box::new(payloads.iter().map(|p| p.to_string()).collect::<Vec<_>>()),
            Box::new(attempts.clone()),
            Box::new(created.clone()),
            Box::new(
                values
                    .iter()
                    .map(|v| v.map(str::to_string))
                    .collect::<Vec<_>>(),
            ),
            Box::new(ctx.worker_id.clone()),
            Box::new(ordering_keys.clone()),
            Box::new(unique_keys.clone()),
        ]
    };
    let insert = |p: Vec<Box<dyn ToSql + Sync + Send>>| async move {
        let refs: Vec<&(dyn ToSql + Sync)> = p.iter().map(|b| &**b as _).collect();
        db.execute(&HISTORY_DONE, &refs).await
    };
    let (savepoint, inserted) = tokio::join!(
        c.batch_execute("SAVEPOINT pgwake_history"),
        insert(params(&values))
    );
    savepoint.map_err(Error::db("claim: savepoint"))?;
    match inserted {
        Ok(_) => Ok(()),
        Err(e) if crate::error::pg_is_connection_lost(&e) => {
            Err(Error::db("claim: recording history")(e))
        }
        Err(e) => {
            tracing::error!(error = %crate::error::PgDisplay(&e), "a result could not be stored in the history; recording these jobs without results");
            c.batch_execute("ROLLBACK TO SAVEPOINT pgwake_history")
                .await
                .map_err(Error::db("claim: recording history"))?;
            values.iter_mut().for_each(|v| *v = None);
            insert(params(&values))
                .await
                .map_err(Error::db("claim: recording history"))?;
            Ok(())
        }
    }
}

/// Resolves once `c`'s connection is closed.
async fn connection_closed(c: &Object) {
    loop {
        tokio::time::sleep(CONNECTION_CHECK).await;
        if c.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_grow_while_fast_and_shrink_to_the_target() {
        let mut s = BatchSizer::new(100);
        assert_eq!(s.size(), 1);
        for _ in 0..10 {
            let n = s.size();
            s.observe(n, Duration::from_millis(1));
        }
        assert_eq!(s.size(), 100);
        s.observe(100, Duration::from_secs(1));
        assert_eq!(s.size(), 10);
        s.observe(10, Duration::from_secs(7));
        assert_eq!(s.size(), 1);
    }
}
