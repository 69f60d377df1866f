//! Writing a batch's outcomes in the claim transaction: requeues, snoozes,
//! sleeps and buries as the outcome mapping says, history rows, the per-job fallback.

use std::time::SystemTime;

use tokio_postgres::types::ToSql;

use crate::claim::context::ClaimContext;
use crate::claim::outcome::{write_of, Finished, Write};
use crate::claim::run::claimed::Claimed;
use crate::error::{Error, Result};
use crate::handler::Delivery;
use crate::job::Resolution;

use crate::db::sql::{
    Db, BATCH_CLEAR, BURY, CLEAR_ATTEMPTS, EDGE_RESULTS, HISTORY_DONE, REQUEUE, SIGNAL_TAKE, SLEEP,
    SNOOZE, WAIT,
};

/// Columns of jobs being written back (requeue) or buried.
#[derive(Default)]
pub(super) struct Columns {
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
    limit_key: Vec<Option<String>>,
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
        self.limit_key.push(c.keys.limit_key.clone());
    }

    fn is_empty(&self) -> bool {
        self.id.is_empty()
    }

    fn requeue_params(&self) -> [&(dyn ToSql + Sync); 16] {
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
            &self.limit_key,
        ]
    }

    fn bury_params<'a>(&'a self, worker: &'a String) -> [&'a (dyn ToSql + Sync); 16] {
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
            &self.limit_key,
        ]
    }
}

/// The rows a batch writes: back to the queue, snoozed (back, counted),
/// and buried.
#[derive(Default)]
pub(super) struct Outcomes {
    back: Columns,
    snoozed: Columns,
    sleeping: Columns,
    /// Waiting for a signal, and the key of each.
    waiting: Columns,
    wait_keys: Vec<String>,
    dead: Columns,
}

impl Outcomes {
    fn is_empty(&self) -> bool {
        self.back.is_empty()
            && self.snoozed.is_empty()
            && self.sleeping.is_empty()
            && self.waiting.is_empty()
            && self.dead.is_empty()
    }
}

/// Sort results into the rows to write back, snooze and bury.
pub(super) fn columns<'a>(
    results: impl Iterator<Item = (&'a Claimed, &'a Resolution)>,
) -> Outcomes {
    let mut o = Outcomes::default();
    for (c, resolution) in results {
        match write_of(c, resolution, Delivery::Tx) {
            Write::Done | Write::Nothing => {}
            Write::Back {
                delay,
                attempts,
                last_error,
            } => o
                .back
                .push(c, delay.map(|d| d.as_secs_f64()), attempts, last_error),
            Write::Snooze {
                delay,
                attempts,
                last_error,
            } => o
                .snoozed
                .push(c, Some(delay.as_secs_f64()), attempts, last_error),
            Write::Sleep {
                delay,
                attempts,
                last_error,
            } => o
                .sleeping
                .push(c, Some(delay.as_secs_f64()), attempts, last_error),
            Write::Wait {
                delay,
                key,
                attempts,
                last_error,
            } => {
                o.waiting
                    .push(c, Some(delay.as_secs_f64()), attempts, last_error);
                o.wait_keys.push(key);
            }
            Write::Dead { attempts, reason } => o.dead.push(c, None, attempts, Some(reason)),
        }
    }
    o
}

/// Write every outcome and commit. An all-done batch commits in the same
/// round trip. Otherwise the outcome writes run in a savepoint first: if
/// they fail for a reason of data (never expected: reasons are sanitised,
/// delays bounded), each job's outcome is written alone, so one job's write
/// can never undo its siblings' work.
///
/// `mark` or `clear` is always given, and its statement precedes the COMMIT
/// and is checked with it: a transaction a handler left aborted (the batch's
/// last savepoint is left to the COMMIT, run.rs) fails here, where a bare
/// COMMIT would quietly roll it back and report success.
pub(super) async fn finish(
    ctx: &ClaimContext,
    db: Db<'_>,
    results: &[Finished],
    mark: Option<i64>,
    clear: Option<&[i64]>,
) -> Result<()> {
    if ctx.history.on() {
        record_done(ctx, db, results).await?;
    }
    keep_edge_results(db, results).await?;
    debug_assert!(
        mark.is_some() || clear.is_some(),
        "a statement before COMMIT"
    );
    let worker = &ctx.worker_id;
    let outcomes = columns(results.iter().map(|r| (&r.claimed, &r.resolution)));
    let c = db.client();
    // Clearing the mark (and a suspect's charges) commits with the batch, so
    // it must reach the server before the pipelined COMMIT: as unnamed
    // statements, sent whole when first polled, both before the COMMIT. (A
    // cached statement not yet prepared on this connection waited for its
    // Prepare round trip, the COMMIT overtook it, and the mark outlived its
    // transaction for a moment: any claim then took the batch for one that
    // never reported, and charged its jobs for runs they never had.)
    let bookkeeping = async {
        let unnamed = Db::unnamed(c);
        let cleared = async {
            match mark {
                Some(token) => unnamed.execute(&BATCH_CLEAR, &[&token]).await,
                None => Ok(0),
            }
        };
        let charges = async {
            match clear {
                Some(ids) => unnamed.execute(&CLEAR_ATTEMPTS, &[&ids]).await,
                None => Ok(0),
            }
        };
        tokio::try_join!(biased; cleared, charges).map(|_| ())
    };
    if outcomes.is_empty() {
        let (b, commit) = tokio::join!(biased; bookkeeping, c.batch_execute("COMMIT"));
        b.and(commit).map_err(Error::db("claim: commit"))?;
        return Ok(());
    }
    c.batch_execute("SAVEPOINT pgwake_outcomes")
        .await
        .map_err(Error::db("claim: savepoint"))?;
    if let Err(e) = write_outcomes(db, worker, &outcomes).await {
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
    let (b, commit) = tokio::join!(biased; bookkeeping, c.batch_execute("COMMIT"));
    b.and(commit).map_err(Error::db("claim: commit"))?;
    Ok(())
}

/// Keep the results of the batch's done jobs on their edges to children
/// that wait (a flow's child reads them: `pgwake.parent_results`), in the
/// claim transaction, whatever the history setting. Sent only when a done
/// job returned a result. A result the database refuses (not expected:
/// results are scrubbed JSON) is rolled back to a savepoint and the jobs
/// end done without it on their edges.
async fn keep_edge_results(db: Db<'_>, results: &[Finished]) -> Result<()> {
    let (ids, values): (Vec<i64>, Vec<Option<String>>) = results
        .iter()
        .filter(|r| r.resolution == Resolution::Done && r.result.is_some())
        .map(|r| (r.claimed.job.id, r.result.clone()))
        .unzip();
    if ids.is_empty() {
        return Ok(());
    }
    let c = db.client();
    let params: [&(dyn ToSql + Sync); 2] = [&ids, &values];
    let (savepoint, kept) = tokio::join!(
        c.batch_execute("SAVEPOINT pgwake_edges"),
        db.execute(&EDGE_RESULTS, &params)
    );
    savepoint.map_err(Error::db("claim: savepoint"))?;
    match kept {
        Ok(_) => Ok(()),
        Err(e) if crate::error::pg_is_connection_lost(&e) => {
            Err(Error::db("claim: keeping results")(e))
        }
        Err(e) => {
            tracing::error!(error = %crate::error::PgDisplay(&e), "a result could not be kept for the job's children; they will see none");
            c.batch_execute("ROLLBACK TO SAVEPOINT pgwake_edges")
                .await
                .map_err(Error::db("claim: keeping results"))
        }
    }
}

/// Requeue, snooze and bury (recording `worker`'s id with dead jobs),
/// pipelined.
pub(super) async fn write_outcomes(
    db: Db<'_>,
    worker: &String,
    o: &Outcomes,
) -> std::result::Result<(), tokio_postgres::Error> {
    let requeue = async {
        if o.back.is_empty() {
            return Ok(0);
        }
        db.execute(&REQUEUE, &o.back.requeue_params()).await
    };
    let snooze = async {
        if o.snoozed.is_empty() {
            return Ok(0);
        }
        db.execute(&SNOOZE, &o.snoozed.requeue_params()).await
    };
    let sleep = async {
        if o.sleeping.is_empty() {
            return Ok(0);
        }
        db.execute(&SLEEP, &o.sleeping.requeue_params()).await
    };
    // The waits, then (in this transaction, their keys' locks taken) the
    // kept signals for their keys.
    let wait = async {
        if o.waiting.is_empty() {
            return Ok(0);
        }
        let mut params = o.waiting.requeue_params().to_vec();
        params.push(&o.wait_keys);
        let n = db.execute(&WAIT, &params).await?;
        db.execute(&SIGNAL_TAKE, &[&o.wait_keys]).await?;
        Ok(n)
    };
    let bury = async {
        if o.dead.is_empty() {
            return Ok(0);
        }
        db.execute(&BURY, &o.dead.bury_params(worker)).await
    };
    tokio::try_join!(requeue, snooze, sleep, wait, bury).map(|_| ())
}

/// One job's outcome in its own savepoint; if even that fails, the job is
/// handed back unchanged (and if that fails too, the batch fails: every job
/// returns to the queue, nothing is lost).
pub(super) async fn write_alone(db: Db<'_>, worker: &String, r: &Finished) -> Result<()> {
    if r.resolution == Resolution::Done {
        return Ok(());
    }
    let c = db.client();
    c.batch_execute("SAVEPOINT pgwake_outcome")
        .await
        .map_err(Error::db("claim: savepoint"))?;
    let outcomes = columns(std::iter::once((&r.claimed, &r.resolution)));
    if let Err(e) = write_outcomes(db, worker, &outcomes).await {
        tracing::error!(job = r.claimed.job.id, error = %crate::error::PgDisplay(&e), "writing a job's outcome failed; handing it back unchanged");
        c.batch_execute("ROLLBACK TO SAVEPOINT pgwake_outcome")
            .await
            .map_err(Error::db("claim: writing outcomes"))?;
        let outcomes = columns(std::iter::once((&r.claimed, &Resolution::Returned)));
        write_outcomes(db, worker, &outcomes)
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
pub(super) async fn record_done(
    ctx: &ClaimContext,
    db: Db<'_>,
    results: &[Finished],
) -> Result<()> {
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
    let limit_keys: Vec<Option<String>> = done
        .iter()
        .map(|r| r.claimed.keys.limit_key.clone())
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
            Box::new(limit_keys.clone()),
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
