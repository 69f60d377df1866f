//! Starts of buffered lease-mode jobs, marked in the database (issue 33,
//! item 2). A claim marks the jobs it puts in the prefetch buffer
//! (`leased_jobs.buffered`); when one of them starts, this service clears
//! the mark, so `pgwake explain`, `pgwake jobs list` and the console show it
//! running rather than buffered, and a crash of the worker charges it.
//!
//! ```text
//!  spawn_run: a buffered job starts ──token──▶ channel ──▶ one UPDATE for
//!  every start queued meanwhile (BEGIN; SET LOCAL synchronous_commit = off;
//!  UPDATE … WHERE token = ANY; COMMIT — pipelined, no WAL flush waited for)
//! ```
//!
//! Off the claim path: a start never waits for its mark. A mark that is
//! late or lost (the database away, a server crash) only leaves the job
//! shown buffered a while longer and, if its worker dies, refunded rather
//! than charged — never charged for a run that did not start.

use tokio::sync::mpsc;

use crate::db::connect::PooledConn;
use crate::db::sql::{Db, LEASE_STARTED};
use crate::error::{Error, Result};

/// Most starts marked by one statement.
const MARK_MAX: usize = 5000;

/// Where runs report the start of a buffered job.
#[derive(Clone)]
pub(crate) struct StartMarks {
    tx: mpsc::UnboundedSender<i64>,
}

impl StartMarks {
    /// The marks of `pool`'s database, written by a task of their own that
    /// ends when every handle is dropped (after writing what it has).
    pub(crate) fn spawn(pool: deadpool_postgres::Pool) -> StartMarks {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(pool, rx));
        StartMarks { tx }
    }

    /// The buffered job of claim token `token` started.
    pub(crate) fn started(&self, token: i64) {
        let _ = self.tx.send(token);
    }
}

async fn run(pool: deadpool_postgres::Pool, mut rx: mpsc::UnboundedReceiver<i64>) {
    while let Some(first) = rx.recv().await {
        let mut tokens = vec![first];
        while tokens.len() < MARK_MAX {
            match rx.try_recv() {
                Ok(t) => tokens.push(t),
                Err(_) => break,
            }
        }
        if let Err(e) = mark(&pool, &tokens).await {
            tracing::debug!(error = %e, jobs = tokens.len(), "marking started prefetched jobs failed; they show as buffered until they end");
        }
    }
}

/// One pipelined round trip, committed asynchronously.
async fn mark(pool: &deadpool_postgres::Pool, tokens: &[i64]) -> Result<()> {
    let mut conn = PooledConn::get(pool, "start marks: no connection").await?;
    let db = Db::unnamed(&conn);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&tokens];
    let (begun, marked, committed) = tokio::join!(
        biased;
        conn.batch_execute("BEGIN; SET LOCAL synchronous_commit = off"),
        db.execute(&LEASE_STARTED, &params),
        conn.batch_execute("COMMIT"),
    );
    conn.check(begun.and(marked).and(committed))
        .map_err(Error::db("start marks"))
}
