//! Running a claimed batch inside the claim transaction: each job in its
//! lazy savepoint (sent ahead, released ahead: `ahead.rs`), the server's
//! limits following each job's timeout, the handler stopped when the claim
//! connection dies.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use deadpool_postgres::Object;

use super::ahead::{self, Ahead};
use crate::claim::context::ClaimContext;
use crate::claim::outcome::resolve::{choose, Run, Stopped};
use crate::claim::outcome::Finished;
use crate::claim::run::claimed::Claimed;
use crate::claim::run::executor::{execute, Ended};
use crate::error::{Error, Result};
use crate::handler::{ClaimClient, Deadline, JobContext};
use crate::job::{Job, Resolution};
use crate::metrics;

use crate::db::sql::{Db, CANCEL_BACKEND, SET_LIMITS};

/// How often a running tx-mode job checks that its claim connection is alive.
pub(super) const CONNECTION_CHECK: Duration = Duration::from_millis(20);

/// State of the claim connection across a batch.
pub(super) struct Session {
    /// When we last sent a statement (the server's idle clock restarts).
    pub(super) last_sent: Instant,
    /// The job timeout the server-side limits currently cover.
    pub(super) limits_for: Option<Duration>,
    /// The claim connection's server process (to cancel a timed-out query).
    pub(super) backend_pid: i32,
    /// The claim transaction's id (`xid8`): what fences its jobs' progress
    /// (`claim/run/progress.rs`).
    pub(super) xid: i64,
    /// The batch's asynchronous mark, made durable before a handler first
    /// uses the database (`mark::Mark`); none for a suspect run alone.
    pub(super) mark: Option<std::sync::Arc<super::mark::Mark>>,
}

/// Run a claimed batch in claim order: runs of one batching handler's task
/// at once ([`crate::Handler::handle_batch`]), every other job alone. Every
/// statement sent ahead has been answered, successfully, when it returns.
pub(super) async fn run_batch(
    ctx: &ClaimContext,
    c: &Object,
    claimed: Vec<Claimed>,
    session: &mut Session,
) -> Result<Vec<Finished>> {
    let mut ahead = Ahead::default();
    let results = run_jobs(ctx, c, claimed, session, &mut ahead).await?;
    // Before the outcomes and the COMMIT: a savepoint or release that
    // failed fails the batch (ahead.rs).
    ahead
        .settle()
        .await
        .map_err(Error::db("claim: savepoint"))?;
    Ok(results)
}

async fn run_jobs<'c>(
    ctx: &ClaimContext,
    c: &'c Object,
    claimed: Vec<Claimed>,
    session: &mut Session,
    ahead: &mut Ahead<'c>,
) -> Result<Vec<Finished>> {
    let mut results = Vec::with_capacity(claimed.len());
    // Every job of the batch can be cancelled from the claim on, also while
    // it waits for its siblings (it then never starts).
    let mut watches: std::collections::HashMap<i64, crate::claim::run::cancels::Watch> = claimed
        .iter()
        .map(|c| (c.job.id, ctx.cancels.watch(c.job.id, &ctx.abort)))
        .collect();
    let mut rest = claimed.into_iter().peekable();
    while let Some(first) = rest.next() {
        let mut group = vec![first];
        // A traced job runs alone: its own spans, its own context for the
        // handler (one call for many jobs has neither).
        let batching = !ctx.config.trace_jobs
            && ctx
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
            if let Some(done) = run_group(ctx, c, &group, session, &watches, ahead).await? {
                results.extend(done);
                continue;
            }
        }
        for claimed in group {
            let watch = watches
                .remove(&claimed.job.id)
                .unwrap_or_else(|| ctx.cancels.watch(claimed.job.id, &ctx.abort));
            let (resolution, result, duration) =
                run_one(ctx, c, &claimed, session, &watch, ahead).await?;
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

/// One statement for a group of jobs of a batching handler, in a savepoint
/// (sent ahead of it, left open after it: ahead.rs). `None`
/// (everything it wrote rolled back) to run them one by one.
pub(super) async fn run_group<'c>(
    ctx: &ClaimContext,
    c: &'c Object,
    group: &[Claimed],
    session: &mut Session,
    watches: &std::collections::HashMap<i64, crate::claim::run::cancels::Watch>,
    ahead: &mut Ahead<'c>,
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
    ahead.reap().map_err(Error::db("claim: savepoint"))?;
    // The handler's statement is about to reach the server: the mark's
    // flush (another connection) runs while the savepoint is on its way.
    // Release what is open in the same message (ahead.rs).
    let take = if ahead.group_savepoint_open {
        "RELEASE SAVEPOINT pgwake_batch; SAVEPOINT pgwake_batch"
    } else if ahead.job_savepoint_open {
        "RELEASE SAVEPOINT pgwake_job; SAVEPOINT pgwake_batch"
    } else {
        "SAVEPOINT pgwake_batch"
    };
    ahead.job_savepoint_open = false;
    let taken = ahead::send(c, take);
    if let Some(mark) = &session.mark {
        mark.make_durable()
            .await
            .map_err(Error::db("claim: make the batch mark durable"))?;
    }
    let started = Instant::now();
    let run = tokio::time::timeout(timeout, handler.handle_batch(&jobs, c));
    let result = tokio::select! {
        r = run => Some(r),
        () = connection_closed(c) => return Err(Error::ConnectionLost("claim connection closed while a handler ran; its claim was rolled back")),
        // Stopping at once: the group's statement is cancelled below and
        // its jobs run one by one, where they are handed back unstarted.
        () = ctx.abort.cancelled() => None,
    };
    let duration = started.elapsed();
    let outcomes = match result {
        Some(Ok(Ok(Some(outcomes)))) if outcomes.len() == group.len() => Some(outcomes),
        Some(Err(_)) | None => {
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
    end_savepoint(c, Savepoint::Group, taken, outcomes.is_some(), ahead).await?;
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
                    resolution: choose(
                        &claimed.job,
                        Stopped::default(),
                        Run::Ended(ended),
                        &ctx.config,
                    ),
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
pub(super) async fn set_limits(db: Db<'_>, session: &mut Session, timeout: Duration) -> Result<()> {
    if session.limits_for != Some(timeout) {
        let ms = crate::config::server_timeout_ms(timeout + crate::config::IDLE_TIMEOUT_MARGIN)
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

/// The savepoints a batch's handlers run in.
#[derive(Clone, Copy)]
enum Savepoint {
    /// One job's handler ([`JobContext::transaction`]); taken by
    /// `ahead::JobSavepoint`.
    Job,
    /// A batching handler's group ([`crate::Handler::handle_batch`]).
    Group,
}

impl Savepoint {
    fn rollback(self) -> &'static str {
        match self {
            Savepoint::Job => "ROLLBACK TO SAVEPOINT pgwake_job",
            Savepoint::Group => "ROLLBACK TO SAVEPOINT pgwake_batch",
        }
    }
}

/// End a savepoint whose `SAVEPOINT` was sent ahead (`taken`, its reply).
/// Kept, it is left open, released with the next savepoint's taking or by
/// the COMMIT (ahead.rs). Undone, the rollback is awaited together with
/// every reply sent ahead so far (a rollback to a savepoint must never hide
/// an earlier failure that aborted the transaction); the savepoint stays
/// open after it too.
async fn end_savepoint<'c>(
    c: &'c Object,
    savepoint: Savepoint,
    taken: ahead::Reply<'c>,
    keep: bool,
    ahead: &mut Ahead<'c>,
) -> Result<()> {
    ahead.push(taken);
    match savepoint {
        Savepoint::Job => ahead.job_savepoint_open = true,
        Savepoint::Group => ahead.group_savepoint_open = true,
    }
    if keep {
        return Ok(());
    }
    let (replies, rolled_back) =
        tokio::join!(ahead.settle(), c.batch_execute(savepoint.rollback()));
    replies
        .and(rolled_back)
        .map_err(Error::db("claim: end of savepoint"))
}

/// Decide and run one job inside the claim transaction.
pub(super) async fn run_one<'c>(
    ctx: &ClaimContext,
    c: &'c Object,
    claimed: &Claimed,
    session: &mut Session,
    watch: &crate::claim::run::cancels::Watch,
    ahead: &mut Ahead<'c>,
) -> Result<(Resolution, Option<String>, Duration)> {
    // Replies that arrived meanwhile: a failure stops the batch here.
    ahead.reap().map_err(Error::db("claim: savepoint"))?;
    let job = &claimed.job;
    if watch.cancelled() {
        // Cancelled while it waited for its siblings: it never starts.
        let stopped = Stopped {
            cancelled: true,
            lease_lost: false,
        };
        let resolution = choose(job, stopped, Run::NotStarted, &ctx.config);
        return Ok((resolution, None, Duration::ZERO));
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
    let take_savepoint = ahead::JobSavepoint::new(c, ahead.job_savepoint_open);
    let claim_client = ClaimClient {
        client: c,
        savepoint: Default::default(),
        take_savepoint: &take_savepoint,
        mark: session.mark.as_deref().map(|m| m as _),
    };
    let deadline = Deadline::new(timeout);
    // Fires on shutdown past the grace period and on a cancel request.
    let interrupt = watch.token();
    let gauge =
        ::metrics::gauge!(metrics::JOBS_IN_FLIGHT, "queue" => metrics::queue_label(&job.queue));
    gauge.increment(1.0);
    let progress = crate::progress::Reporter::new(
        ctx.progress.clone(),
        job.id,
        crate::progress::Run::Tx(session.xid),
    );
    let (span, trace) = crate::claim::run::trace::run_span(claimed);
    let job_ctx = JobContext {
        transaction: Some(&claim_client),
        pool: &ctx.pool,
        cancel: interrupt.child_token(),
        deadline: &deadline,
        admitted_at: claimed.admitted_at,
        keys: &claimed.keys,
        progress: &progress,
        steps: crate::steps::Steps::new(job.id, job.attempt, None),
        trace,
        inputs: None,
    };
    let run = execute(handler.as_ref(), job, job_ctx, interrupt, span);
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
    crate::claim::run::trace::run_ended(claimed);
    let used = claim_client.savepoint.load(Ordering::Acquire);
    if deadline.at() > Instant::now() + timeout {
        // The handler extended its deadline (and the server's limits).
        session.limits_for = None;
    }
    let cancelled = watch.cancelled();
    let interrupted = matches!(ended, Ended::Interrupted);
    if used && (timed_out.0 || cancelled || interrupted) {
        // The handler's statement may still be running on the server (it
        // timed out, was cancelled, or the worker is stopping at once):
        // stop it, or the savepoint rollback would wait behind it.
        cancel_backend(ctx, session.backend_pid).await;
    }
    let result = ctx.result_of(&ended);
    // A cancel wins over whatever the handler returned: nothing is
    // committed yet, so its work is rolled back with the savepoint below.
    let stopped = Stopped {
        cancelled,
        lease_lost: false,
    };
    let resolution = choose(job, stopped, Run::Ended(ended), &ctx.config);
    if let Some(taken) = take_savepoint.reply() {
        let keep = resolution == Resolution::Done;
        end_savepoint(c, Savepoint::Job, taken, keep, ahead).await?;
        session.last_sent = Instant::now();
    }
    Ok((resolution, result, duration))
}

/// Cancel whatever the claim connection's server process is running (a
/// timed-out handler's statement), from another connection.
pub(super) async fn cancel_backend(ctx: &ClaimContext, pid: i32) {
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

/// Resolves once `c`'s connection is closed.
pub(super) async fn connection_closed(c: &Object) {
    loop {
        tokio::time::sleep(CONNECTION_CHECK).await;
        if c.is_closed() {
            return;
        }
    }
}
