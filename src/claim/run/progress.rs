//! The progress writer: coalesces what running jobs report
//! ([`crate::JobContext::progress`]) and writes it every
//! `progress_interval`, one statement for every job that reported since
//! the last write (`progress_flush.sql`), never one per report. A job
//! that reports 100 times between two writes is written once, with its
//! latest value. Each write is fenced by its run (its lease token, or its
//! tx claim's transaction): a run that is over writes nothing.
//!
//! ```text
//! handler ─report─▶ pending[job] = latest ─┐ every progress_interval
//! run ends ─ended─▶ cleared += (job, run) ─┴▶ flush: DELETE cleared; INSERT … ON CONFLICT pending
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::db::connect::PooledConn;
use crate::db::sql::{Db, PROGRESS_CLEAR, PROGRESS_FLUSH};
use crate::error::{Error, Result};
use crate::metrics;
use crate::progress::{ProgressSink, Run};

/// One job's latest report, not yet written.
#[derive(Debug, Clone)]
struct Pending {
    run: Run,
    value: String,
    message: Option<String>,
}

#[derive(Debug, Default)]
struct State {
    pending: HashMap<i64, Pending>,
    cleared: Vec<(i64, Run)>,
}

/// What one [`Progress::flush`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flushed {
    /// Reports sent (one per job).
    pub sent: usize,
    /// Rows written (the others' runs were over: fenced out).
    pub written: usize,
    /// Rows of ended runs cleared.
    pub cleared: usize,
    /// Statements sent.
    pub statements: usize,
}

/// The worker's progress writer, shared by every run (as their
/// [`ProgressSink`]) and by its flushing task.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    state: Mutex<State>,
}

impl ProgressSink for Progress {
    fn report(&self, job: i64, run: Run, value: String, message: Option<String>) {
        let mut s = self.state.lock().expect("progress state");
        s.pending.insert(
            job,
            Pending {
                run,
                value,
                message,
            },
        );
    }

    fn ended(&self, job: i64, run: Run) {
        let mut s = self.state.lock().expect("progress state");
        if s.pending.get(&job).is_some_and(|p| p.run == run) {
            s.pending.remove(&job);
        }
        s.cleared.push((job, run));
    }
}

/// A run's two columns: its claim token or its claim transaction.
fn columns(run: Run) -> (Option<i64>, Option<String>) {
    match run {
        Run::Lease(token) => (Some(token), None),
        Run::Tx(xid) => (None, Some(xid.to_string())),
    }
}

impl Progress {
    /// Write what was reported since the last flush: clear the rows of
    /// runs that ended, then write every pending report, each fenced by its
    /// run. On an error nothing is lost but what newer reports replaced:
    /// the rest is tried again at the next flush.
    pub(crate) async fn flush(
        &self,
        pool: &deadpool_postgres::Pool,
        prepared: crate::config::PreparedStatements,
    ) -> Result<Flushed> {
        let taken = std::mem::take(&mut *self.state.lock().expect("progress state"));
        if taken.pending.is_empty() && taken.cleared.is_empty() {
            return Ok(Flushed::default());
        }
        let result = self.write(&taken, pool, prepared).await;
        if result.is_err() {
            let mut s = self.state.lock().expect("progress state");
            for (job, p) in taken.pending {
                s.pending.entry(job).or_insert(p);
            }
            let mut cleared = taken.cleared;
            cleared.append(&mut s.cleared);
            s.cleared = cleared;
        }
        result
    }

    async fn write(
        &self,
        taken: &State,
        pool: &deadpool_postgres::Pool,
        prepared: crate::config::PreparedStatements,
    ) -> Result<Flushed> {
        let mut conn = PooledConn::get(pool, "progress: no connection").await?;
        let mut flushed = Flushed::default();
        if !taken.cleared.is_empty() {
            let mut ids = Vec::with_capacity(taken.cleared.len());
            let mut tokens = Vec::with_capacity(taken.cleared.len());
            let mut xids = Vec::with_capacity(taken.cleared.len());
            for (job, run) in &taken.cleared {
                let (token, xid) = columns(*run);
                ids.push(*job);
                tokens.push(token);
                xids.push(xid);
            }
            let r = Db::pooled(&conn, prepared)
                .execute(&PROGRESS_CLEAR, &[&ids, &tokens, &xids])
                .await;
            flushed.cleared = conn.check(r).map_err(Error::db("progress: clear"))? as usize;
            flushed.statements += 1;
        }
        if !taken.pending.is_empty() {
            let n = taken.pending.len();
            let (mut ids, mut tokens, mut xids) = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            let (mut values, mut messages) = (Vec::with_capacity(n), Vec::with_capacity(n));
            for (job, p) in &taken.pending {
                let (token, xid) = columns(p.run);
                ids.push(*job);
                tokens.push(token);
                xids.push(xid);
                values.push(p.value.as_str());
                messages.push(p.message.as_deref());
            }
            let r = Db::pooled(&conn, prepared)
                .query(&PROGRESS_FLUSH, &[&ids, &tokens, &xids, &values, &messages])
                .await;
            let rows = conn.check(r).map_err(Error::db("progress: write"))?;
            flushed.sent = n;
            flushed.written = rows.len();
            flushed.statements += 1;
            ::metrics::counter!(metrics::PROGRESS_WRITES).increment(rows.len() as u64);
        }
        ::metrics::counter!(metrics::PROGRESS_FLUSHES).increment(flushed.statements as u64);
        Ok(flushed)
    }
}

/// The flushing task: every `interval` until `stop`, then once more for
/// what the last runs reported and cleared.
pub(crate) async fn run(
    progress: Arc<Progress>,
    pool: deadpool_postgres::Pool,
    prepared: crate::config::PreparedStatements,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        let stopping = tokio::select! {
            _ = stop.cancelled() => true,
            _ = tokio::time::sleep(interval) => false,
        };
        if let Err(e) = progress.flush(&pool, prepared).await {
            tracing::warn!(error = %e, "writing progress failed; the latest reports are written at the next try");
        }
        if stopping {
            return;
        }
    }
}
