//! `tx` delivery mode: the claim transaction stays open while the batch's
//! handlers run (DESIGN.md §2).
//!
//! ```text
//!  BEGIN; SET LOCAL timeouts; DELETE … SKIP LOCKED RETURNING   (one round trip)
//!  count an attempt per job in pgwake.tx_attempts (other connection, committed)
//!  for each job:  [SAVEPOINT] handler [RELEASE | ROLLBACK TO SAVEPOINT]
//!  requeue failed/unstarted, bury dead, clear attempt counts; COMMIT  (pipelined)
//! ```
//!
//! - success: the DELETE commits with whatever the handler wrote;
//! - failure: rolled back to the job's savepoint (its siblings keep their
//!   work) and re-inserted with `attempts + 1`, `last_error` and a backoff
//!   `run_at`, or buried in `dead_jobs` at `max_attempts`;
//! - crash / lost connection: the server rolls everything back and the jobs
//!   are claimable at once; the attempt was already counted in
//!   `pgwake.tx_attempts`, so a job that keeps killing its worker ends dead.
//!
//! Any error before COMMIT drops the connection instead of returning it to
//! the pool, so no pooled connection is ever left idle in a transaction.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::Object;

use crate::claimer::Shared;
use crate::completion::{claimed_jobs, decide, precheck, report, Claimed, ClaimedRow, Verdict};
use crate::error::{Error, Result};
use crate::executor::execute;
use crate::handler::JobContext;
use crate::metrics;
use crate::wake::Trigger;

const CLAIM_ALL: &str = include_str!("sql/claim_tx_all.sql");
const CLAIM_QUEUE: &str = include_str!("sql/claim_tx_queue.sql");
const RECORD_ATTEMPTS: &str = include_str!("sql/record_attempts.sql");
const CLEAR_ATTEMPTS: &str = include_str!("sql/clear_attempts.sql");
const REQUEUE: &str = include_str!("sql/requeue.sql");
const BURY: &str = include_str!("sql/bury.sql");

/// The claim transaction's opening statements.
pub(crate) fn begin_sql(config: &crate::config::WorkerConfig) -> String {
    format!(
        "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {}; SET LOCAL statement_timeout = {}",
        config.idle_in_transaction_timeout().as_millis(),
        config.job_timeout.as_millis() + crate::config::IDLE_TIMEOUT_MARGIN.as_millis()
    )
}

/// A pooled connection with an open transaction. Dropped without
/// [`OpenTx::committed`], it closes the connection (the server rolls back)
/// rather than returning it to the pool mid-transaction: this is what makes
/// a claim future cancelled at any await point lose nothing.
struct OpenTx {
    conn: Option<Object>,
}

impl OpenTx {
    fn conn(&self) -> &Object {
        self.conn.as_ref().expect("connection present until drop")
    }

    fn committed(mut self) {
        // Back to the pool, transaction closed.
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

/// Claim up to `batch` jobs and run them; returns how many were claimed.
pub(crate) async fn claim_and_run(shared: &Shared, trigger: Trigger) -> Result<usize> {
    let conn = shared
        .pool
        .get()
        .await
        .map_err(Error::pool("claim: no connection"))?;
    let limit = shared.config.batch as i64;
    let stmt = conn
        .prepare_cached(if shared.tx_queues.is_some() {
            CLAIM_QUEUE
        } else {
            CLAIM_ALL
        })
        .await
        .map_err(Error::db("claim: prepare"))?;
    let tx = OpenTx { conn: Some(conn) };
    let c = tx.conn();
    // With --queues, each queue is claimed with a scalar `queue = $2`, which
    // the (queue, priority, run_at, id) index serves in claim order whatever
    // the statistics (`queue = ANY($2)` lets the planner sort every ready row
    // instead). Queues are tried in turn from a rotating start, inside the
    // same transaction, until one has jobs.
    let queues: Vec<Option<&String>> = match &shared.tx_queues {
        None => vec![None],
        Some(q) => rotated(q, &shared.queue_cursor)
            .into_iter()
            .map(Some)
            .collect(),
    };
    // Pipelined: BEGIN and the first claim go out together.
    let (begun, first) = tokio::join!(
        c.batch_execute(&shared.begin_sql),
        claim_rows(c, &stmt, limit, queues[0], &shared.lease_queues)
    );
    begun.map_err(Error::db("claim: begin"))?;
    let mut rows = first.map_err(Error::db("claim"))?;
    for queue in &queues[1..] {
        if !rows.is_empty() {
            break;
        }
        rows = claim_rows(c, &stmt, limit, *queue, &shared.lease_queues)
            .await
            .map_err(Error::db("claim"))?;
    }
    let hit = if rows.is_empty() { "empty" } else { "hit" };
    ::metrics::counter!(metrics::CLAIMS, "trigger" => trigger.as_str(), "result" => hit)
        .increment(1);
    if rows.is_empty() {
        c.batch_execute("COMMIT")
            .await
            .map_err(Error::db("claim: commit"))?;
        tx.committed();
        return Ok(0);
    }
    if rows.len() == shared.config.batch {
        // There is likely more: let one more task help drain.
        shared.wake.wake_one(Trigger::Drain);
    }
    let mut claimed = claimed_jobs(&rows);
    let count = claimed.len();

    // Count the attempt where a rollback cannot erase it.
    let ids: Vec<i64> = claimed.iter().map(|r| r.job.id).collect();
    let pending = record_attempts(shared, &ids).await?;
    for row in &mut claimed {
        row.job.attempt += pending.get(&row.job.id).copied().unwrap_or(1);
    }

    let mut results = Vec::with_capacity(count);
    let mut last_statement = Instant::now();
    for row in claimed {
        let (verdict, duration) = run_one(shared, c, &row, &mut last_statement).await?;
        results.push(Claimed {
            job: row.job,
            raw_payload: row.raw_payload,
            last_error: row.last_error,
            verdict,
            duration,
        });
    }

    let retry_at = finish(c, &ids, &results).await?;
    tx.committed();
    report(shared, &results, &retry_at);
    Ok(count)
}

async fn record_attempts(shared: &Shared, ids: &[i64]) -> Result<HashMap<i64, i32>> {
    let conn = shared
        .attempts_pool
        .get()
        .await
        .map_err(Error::pool("claim: no connection to record attempts"))?;
    let stmt = conn
        .prepare_cached(RECORD_ATTEMPTS)
        .await
        .map_err(Error::db("claim: prepare"))?;
    let rows = conn
        .query(&stmt, &[&ids])
        .await
        .map_err(Error::db("claim: record attempts"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Decide and run one job inside the claim transaction.
async fn run_one(
    shared: &Shared,
    c: &Object,
    row: &ClaimedRow,
    last_statement: &mut Instant,
) -> Result<(Verdict, Duration)> {
    let job = &row.job;
    let handler = match precheck(shared, row) {
        Ok(handler) => handler,
        Err(verdict) => return Ok((verdict, Duration::ZERO)),
    };
    let savepoint = handler.uses_transaction();
    if savepoint {
        c.batch_execute("SAVEPOINT pgwake_job")
            .await
            .map_err(Error::db("claim: savepoint"))?;
        *last_statement = Instant::now();
    } else if last_statement.elapsed() > crate::config::IDLE_TIMEOUT_MARGIN / 2 {
        // Earlier jobs of this batch ran without a statement on the
        // connection: restart the server's idle-in-transaction clock so the
        // whole batch is not cut off by a limit meant for one job.
        c.simple_query("")
            .await
            .map_err(Error::db("claim: keepalive"))?;
        *last_statement = Instant::now();
    }
    let gauge = ::metrics::gauge!(metrics::JOBS_IN_FLIGHT, "queue" => job.queue.clone());
    gauge.increment(1.0);
    let ctx = JobContext {
        transaction: Some(&***c),
        pool: &shared.pool,
        cancel: shared.abort.child_token(),
    };
    let run = execute(
        handler.as_ref(),
        job,
        ctx,
        shared.config.job_timeout,
        &shared.abort,
    );
    // If the claim connection dies under a running handler (server restart,
    // pg_terminate_backend), the claim is already rolled back and another
    // worker may take the job: stop this run now rather than let it go on
    // beside the next one, and let the claim fail.
    let (execution, duration) = tokio::select! {
        r = run => r,
        () = connection_closed(c) => {
            gauge.decrement(1.0);
            return Err(Error::ConnectionLost("claim connection closed while a handler ran; its claim was rolled back"));
        }
    };
    gauge.decrement(1.0);
    let verdict = decide(shared, job, execution);
    if savepoint {
        let sql = match verdict {
            Verdict::Done => "RELEASE SAVEPOINT pgwake_job",
            _ => "ROLLBACK TO SAVEPOINT pgwake_job",
        };
        c.batch_execute(sql)
            .await
            .map_err(Error::db("claim: end of savepoint"))?;
    }
    *last_statement = Instant::now();
    Ok((verdict, duration))
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
}

impl Columns {
    fn push(&mut self, c: &Claimed, delay: Option<f64>, attempts: i32, last_error: Option<String>) {
        let job = &c.job;
        self.id.push(job.id);
        self.queue.push(job.queue.clone());
        self.task.push(job.task.clone());
        self.payload.push(c.raw_payload.clone());
        self.priority.push(job.priority);
        self.run_at.push(job.run_at);
        self.delay.push(delay);
        self.attempts.push(attempts);
        self.max_attempts.push(job.max_attempts);
        self.last_error.push(last_error);
        self.created_at.push(job.created_at);
    }
}

/// Write every outcome and commit, pipelined. Returns the new run_at of
/// retried jobs.
async fn finish(c: &Object, ids: &[i64], results: &[Claimed]) -> Result<Vec<SystemTime>> {
    let mut back = Columns::default();
    let mut dead = Columns::default();
    for r in results {
        match &r.verdict {
            Verdict::Done => {}
            Verdict::Retry { reason, delay } => back.push(
                r,
                Some(delay.as_secs_f64()),
                r.job.attempt,
                Some(reason.clone()),
            ),
            // (LeaseLost cannot happen in tx mode; treated as handed back.)
            Verdict::Returned | Verdict::LeaseLost => {
                back.push(r, None, r.job.attempt - 1, r.last_error.clone())
            }
            Verdict::Dead { reason } => dead.push(r, None, r.job.attempt, Some(reason.clone())),
        }
    }
    let (requeue_stmt, bury_stmt, clear_stmt) = tokio::try_join!(
        c.prepare_cached(REQUEUE),
        c.prepare_cached(BURY),
        c.prepare_cached(CLEAR_ATTEMPTS)
    )
    .map_err(Error::db("claim: prepare"))?;
    let requeue = async {
        if back.id.is_empty() {
            return Ok(Vec::new());
        }
        c.query(
            &requeue_stmt,
            &[
                &back.id,
                &back.queue,
                &back.task,
                &back.payload,
                &back.priority,
                &back.run_at,
                &back.delay,
                &back.attempts,
                &back.max_attempts,
                &back.last_error,
                &back.created_at,
            ],
        )
        .await
        .map(|rows| rows.iter().map(|r| r.get::<_, SystemTime>(1)).collect())
    };
    let bury = async {
        if dead.id.is_empty() {
            return Ok(0);
        }
        c.execute(
            &bury_stmt,
            &[
                &dead.id,
                &dead.queue,
                &dead.task,
                &dead.payload,
                &dead.priority,
                &dead.run_at,
                &dead.attempts,
                &dead.max_attempts,
                &dead.last_error,
                &dead.created_at,
            ],
        )
        .await
    };
    let clear_params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&ids];
    let clear = c.execute(&clear_stmt, &clear_params);
    let commit = c.batch_execute("COMMIT");
    let (run_at, _, _, ()) = tokio::try_join!(requeue, bury, clear, commit)
        .map_err(Error::db("claim: writing outcomes"))?;
    Ok(run_at)
}

/// How often a running tx-mode job checks that its claim connection is alive.
const CONNECTION_CHECK: Duration = Duration::from_millis(20);

/// Resolves once `c`'s connection is closed.
async fn connection_closed(c: &Object) {
    loop {
        tokio::time::sleep(CONNECTION_CHECK).await;
        if c.is_closed() {
            return;
        }
    }
}

/// One claim statement: over every queue but the lease queues, or from one
/// queue.
async fn claim_rows(
    c: &Object,
    stmt: &tokio_postgres::Statement,
    limit: i64,
    queue: Option<&String>,
    lease_queues: &[String],
) -> std::result::Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
    match queue {
        None => c.query(stmt, &[&limit, &lease_queues]).await,
        Some(q) => c.query(stmt, &[&limit, q]).await,
    }
}

/// `queues` starting at a position that advances on every call, so no queue
/// is always tried first.
pub(crate) fn rotated<'a>(
    queues: &'a [String],
    cursor: &std::sync::atomic::AtomicUsize,
) -> Vec<&'a String> {
    if queues.is_empty() {
        return Vec::new();
    }
    let start = cursor.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % queues.len();
    queues[start..].iter().chain(&queues[..start]).collect()
}
