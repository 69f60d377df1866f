//! Starts of buffered lease-mode jobs, marked in the database (issue 33,
//! item 2). A claim marks the jobs it puts in the prefetch buffer
//! (`leased_jobs.buffered`); when one of them has run for [`MARK_AFTER`],
//! this service clears the mark, so `pgwake explain`, `pgwake jobs list`
//! and the console show it running rather than buffered, and a crash of the
//! worker charges it.
//!
//! ```text
//!  spawn_run: a buffered job starts ──(token, when)──▶ channel ──▶ pending
//!  MARK_AFTER later, the runs still going: one UPDATE for all of them
//!  (BEGIN; SET LOCAL synchronous_commit = off; UPDATE … WHERE token = ANY;
//!  COMMIT — pipelined, no WAL flush waited for)
//!  a run that ends before: never marked (its outcome write removes the row)
//! ```
//!
//! Most buffered runs are short (the buffer holds a few milliseconds of
//! starts): marking each cost lease mode an UPDATE, a dead tuple and about
//! 230 bytes of WAL per job (issue 34, item 9). A run shorter than
//! [`MARK_AFTER`] is shown buffered while it runs, and if its worker dies
//! within that time its attempt is refunded and it becomes a suspect, which
//! then runs only on a free slot and is charged from its claim: a poison job
//! gets at most one uncharged run, never an endless loop.
//!
//! Off the claim path: a start never waits for its mark. A mark that is
//! late or lost (the database away, a server crash) only leaves the job
//! shown buffered a while longer and, if its worker dies, refunded rather
//! than charged — never charged for a run that did not start.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::db::connect::PooledConn;
use crate::db::sql::{Db, LEASE_STARTED};
use crate::error::{Error, Result};

/// Most starts marked by one statement.
const MARK_MAX: usize = 5000;

/// How long a buffered job runs before its start is marked.
pub(crate) const MARK_AFTER: Duration = Duration::from_millis(100);

/// Where runs report the start and the end of a buffered job.
#[derive(Clone)]
pub(crate) struct StartMarks {
    tx: mpsc::UnboundedSender<(Instant, i64)>,
    /// Tokens of buffered runs started and not ended, not marked yet.
    running: Arc<Mutex<HashSet<i64>>>,
}

impl StartMarks {
    /// The marks of `pool`'s database, written by a task of their own that
    /// ends when every handle is dropped.
    pub(crate) fn spawn(pool: deadpool_postgres::Pool) -> StartMarks {
        StartMarks::spawn_after(pool, MARK_AFTER)
    }

    /// Marks written for the runs still going `after` their start.
    pub(crate) fn spawn_after(pool: deadpool_postgres::Pool, after: Duration) -> StartMarks {
        let (tx, rx) = mpsc::unbounded_channel();
        let running = Arc::new(Mutex::new(HashSet::new()));
        tokio::spawn(run(pool, rx, running.clone(), after));
        StartMarks { tx, running }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        self.running.lock().expect("start marks")
    }

    /// The buffered job of claim token `token` started.
    pub(crate) fn started(&self, token: i64) {
        self.running().insert(token);
        let _ = self.tx.send((Instant::now(), token));
    }

    /// The run of `token` ended: its start is not marked any more.
    pub(crate) fn ended(&self, token: i64) {
        self.running().remove(&token);
    }
}

async fn run(
    pool: deadpool_postgres::Pool,
    mut rx: mpsc::UnboundedReceiver<(Instant, i64)>,
    running: Arc<Mutex<HashSet<i64>>>,
    after: Duration,
) {
    // Starts in start order, each due `after` it.
    let mut pending: VecDeque<(Instant, i64)> = VecDeque::new();
    loop {
        let due = pending.front().map(|&(at, _)| at + after);
        tokio::select! {
            biased;
            started = rx.recv() => match started {
                Some(s) => pending.push_back(s),
                None => return,
            },
            _ = sleep_until(due) => {}
        }
        let now = Instant::now();
        let mut tokens = Vec::new();
        {
            let mut running = running.lock().expect("start marks");
            while tokens.len() < MARK_MAX {
                match pending.front() {
                    Some(&(at, token)) if at + after <= now => {
                        pending.pop_front();
                        // Still running: mark it (and forget it).
                        if running.remove(&token) {
                            tokens.push(token);
                        }
                    }
                    _ => break,
                }
            }
        }
        if tokens.is_empty() {
            continue;
        }
        if let Err(e) = mark(&pool, &tokens).await {
            tracing::debug!(error = %e, jobs = tokens.len(), "marking started prefetched jobs failed; they show as buffered until they end");
        }
    }
}

/// Until `due`, or for ever.
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due.into()).await,
        None => std::future::pending().await,
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
