//! The crash ledger: a batch is marked durably before its handlers run;
//! the jobs of a batch whose mark outlived its transaction are suspects,
//! run one at a time, each charged before it starts.

use std::time::Instant;

use tokio_postgres::types::ToSql;

use crate::claim::context::ClaimContext;
use crate::claim::run::claimed::Claimed;
use crate::claim::run::row::{ClaimRow, Mode};
use crate::error::{Error, Result};

use super::mark::Mark;
use super::run::{run_batch, Session};
use super::write::finish;
use super::OpenTx;
use crate::db::sql::{
    Db, ADOPT_STALE, BATCH_MARK, BATCH_MARK_BY_JOB, CHARGE, CLAIM_TX_ONE as CLAIM_ONE,
};

/// The queue and limit key of each job of a batch that has a limit key and
/// holds no key slot (two arrays of the same length; `None`: no such job),
/// for its mark: a per-key limit set while they run counts them (migration
/// 0022).
#[derive(Debug, Default)]
pub(super) struct UnslottedKeys {
    queues: Option<Vec<String>>,
    keys: Option<Vec<String>>,
}

impl UnslottedKeys {
    /// The (queue, limit key) of each such job.
    pub(super) fn of<'a>(jobs: impl Iterator<Item = (&'a str, &'a str)>) -> UnslottedKeys {
        let (queues, keys): (Vec<String>, Vec<String>) =
            jobs.map(|(q, k)| (q.to_string(), k.to_string())).unzip();
        if keys.is_empty() {
            return UnslottedKeys::default();
        }
        UnslottedKeys {
            queues: Some(queues),
            keys: Some(keys),
        }
    }

    /// Whether there is such a job.
    fn any(&self) -> bool {
        self.keys.is_some()
    }
}

/// What [`mark_batch`] found.
pub(super) enum Marked {
    /// The batch is marked: its handlers may run.
    Mark(Mark),
    /// Some of its jobs are suspects (an earlier claim of each ended
    /// without an outcome): nothing is marked; the claim gives every job
    /// back and runs these alone.
    Suspects(Vec<i64>),
}

/// Record "transaction `xid` holds `ids`" before any handler runs (an
/// asynchronous commit: see [`Mark`]), with the queue of each job when they
/// hold no queue slots (`queues`: counted by a max_running limit set while
/// they run), and the keyed jobs that hold no key slot (`keys`: counted by
/// a per-key limit set while they run). `by_job` (under pressure): unless
/// one of `ids` is a suspect, checked in the same statement by job
/// (`batch_mark_by_job.sql`); otherwise the claim has checked already
/// (`suspects.sql`) and the batch is marked.
pub(super) async fn mark_batch(
    ctx: &ClaimContext,
    xid: &str,
    ids: &[i64],
    queues: Option<Vec<String>>,
    keys: UnslottedKeys,
    by_job: bool,
) -> Result<Marked> {
    let mut conn = crate::db::connect::PooledConn::get(
        &ctx.ledger_pool,
        "claim: no connection to mark the batch",
    )
    .await?;
    // One round trip: the three requests are pipelined, in this order (the
    // insert as the unnamed statement: a cached one could need a Parse
    // round trip first and land after the COMMIT). Durable at once when the
    // last batch's handlers used the database.
    let durable = ctx
        .tx
        .marks_durable
        .load(std::sync::atomic::Ordering::Relaxed);
    let begin = if durable {
        "BEGIN"
    } else {
        "BEGIN; SET LOCAL synchronous_commit = off"
    };
    let params: [&(dyn ToSql + Sync); 6] = [
        &xid,
        &ids,
        &ctx.worker_id,
        &queues,
        &keys.queues,
        &keys.keys,
    ];
    let (begun, marked, committed) = tokio::join!(
        biased;
        conn.batch_execute(begin),
        Db::unnamed(&conn).query_one(
            if by_job {
                &BATCH_MARK_BY_JOB
            } else {
                &BATCH_MARK
            },
            &params
        ),
        conn.batch_execute("COMMIT"),
    );
    let row = conn
        .check(begun.and(marked).and_then(|row| committed.map(|()| row)))
        .map_err(Error::db("claim: mark batch"))?;
    let token = if by_job {
        row.get::<_, Option<i64>>(0)
    } else {
        Some(row.get(0))
    };
    Ok(match token {
        Some(token) => Marked::Mark(Mark::new(token, durable, ctx.ledger_pool.clone())),
        None => Marked::Suspects(row.get(1)),
    })
}

/// Run each suspect alone, charged before it starts.
pub(super) async fn run_suspects(ctx: &ClaimContext, ids: Vec<i64>) -> Result<()> {
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

pub(super) async fn run_suspect(ctx: &ClaimContext, id: i64) -> Result<()> {
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
    let admission =
        crate::claim::choose::rate::reserve_on_own(ctx.ledger(), None, Some(id), 1).await?;
    let admitted = !admission.none();
    // And to a per-key rate: one admission of its key (key_rate.rs).
    let key_admission = if admitted {
        Some(
            crate::claim::choose::key_rate::reserve(
                ctx.ledger(),
                crate::claim::choose::key_rate::Wanted {
                    queue: "",
                    after: None,
                    count: 1,
                    tasks_in: &None,
                    tasks_not_in: &[],
                    job: Some(id),
                },
            )
            .await?,
        )
    } else {
        None
    };
    let key_admitted = key_admission.as_ref().is_some_and(|a| a.any());
    let params: [&(dyn ToSql + Sync); 3] = [&id, &admitted, &key_admitted];
    let (begun, rows) = tokio::join!(
        biased;
        c.batch_execute(&ctx.tx.begin_sql),
        db.query(&CLAIM_ONE, &params)
    );
    begun.map_err(Error::db("claim: begin"))?;
    let rows = rows.map_err(Error::db("claim"))?;
    crate::claim::choose::rate::settle(ctx.ledger(), Some(&admission), rows.len()).await?;
    let used: Vec<Option<&str>> = rows
        .iter()
        .map(|r| ClaimRow::read(r, Mode::Tx).limit_key())
        .collect();
    crate::claim::choose::key_rate::settle(ctx.ledger(), key_admission.as_ref(), used.into_iter())
        .await?;
    let Some(row) = rows.first() else {
        // Taken by another worker meanwhile, or not due.
        c.batch_execute("COMMIT")
            .await
            .map_err(Error::db("claim: commit"))?;
        tx.release();
        return Ok(());
    };
    let row = ClaimRow::read(row, Mode::Tx);
    let mut claimed = row.claimed();
    let key_admitted_at = key_admission
        .as_ref()
        .filter(|a| a.any() && claimed.keys.limit_key.is_some())
        .and_then(|a| a.admitted());
    claimed.admitted_at = key_admitted_at.or(admission.admitted());
    let backend_pid = row.backend_pid();
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
    let xid = row.xid();
    let mark = mark_alone(ctx, row, &claimed, &xid).await?;
    tracing::info!(
        job = id,
        attempt = claimed.job.attempt,
        "running a job alone: an earlier run of its batch never reported"
    );
    let mut session = Session {
        last_sent: Instant::now(),
        limits_for: Some(ctx.config.job_timeout),
        backend_pid,
        xid: super::parse_xid(&xid),
        // A suspect's charge is durable already (charge.sql).
        mark: None,
    };
    let results = run_batch(ctx, c, vec![claimed], &mut session).await?;
    finish(ctx, db, &results, mark, Some(&[id])).await?;
    tx.release();
    for r in results {
        ctx.report(&r.claimed, r.resolution, r.duration);
    }
    Ok(())
}

/// The mark of a suspect run alone in transaction `xid`: one when it holds
/// no queue slot or no key slot, `None` otherwise; returns its token.
async fn mark_alone(
    ctx: &ClaimContext,
    row: ClaimRow<'_>,
    claimed: &Claimed,
    xid: &str,
) -> Result<Option<i64>> {
    // Run without a queue slot or a key slot (claimed while its queue or
    // key had no limit), it is named in a mark of its own, as a batch's
    // jobs are (`mark_batch`), so that a limit set while it runs counts it.
    // The mark holds no job id: its charge is made already (a stale mark
    // of one job would charge it again), and it is cleared with the
    // outcome; a run that dies leaves it to `adopt_stale.sql`.
    let holds_slot = row.holds_slot();
    let holds_key_slot = row.holds_key_slot();
    let queues = (!holds_slot).then(|| vec![claimed.job.queue.clone()]);
    let keys = UnslottedKeys::of(
        claimed
            .keys
            .limit_key
            .as_deref()
            .filter(|_| !holds_key_slot)
            .map(|k| (claimed.job.queue.as_str(), k))
            .into_iter(),
    );
    Ok(if queues.is_some() || keys.any() {
        // No job ids: nothing to find suspect, so always a mark.
        match mark_batch(ctx, xid, &[], queues, keys, false).await? {
            Marked::Mark(mark) => Some(mark.token),
            Marked::Suspects(_) => unreachable!("a mark without jobs names no suspect"),
        }
    } else {
        None
    })
}
