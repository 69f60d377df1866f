//! Fair claims over every queue. The all-queues claim statement orders jobs
//! by (priority, run_at, id) across queues, so a deep backlog in one queue
//! would be served before a job inserted later into another. Instead, a
//! worker serving every queue keeps the list of queues that have ready jobs
//! (`sql/ready_queues.sql`, a loose index scan) and claims from them one
//! queue per statement, starting one queue further each round — as it does
//! for `--queues` lists — with the all-queues statement last, for queues
//! that appeared since the list was read.
//!
//! ```text
//!  round: list stale (≥ REFRESH_ROUNDS rounds, or the last round, started by
//!         a notification, poll or reconnect, found nothing)?
//!           └─ yes: re-read the ready queues
//!         try each listed queue in turn from a rotating start (queue = $2;
//!         a lone plain queue is left to the all-queues statement, plan.rs)
//!         then the all-queues statement (new queues)
//! ```
//!
//! The bound: a queue with ready jobs is claimed from within
//! `REFRESH_ROUNDS + n` claim rounds of the worker after its jobs became
//! ready (`n`: queues with ready jobs), whatever the backlog of the others;
//! priorities still order jobs within a queue.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::connect::PooledConn;
use crate::context::ClaimContext;
use crate::error::{Error, Result};
use crate::plan::{ClaimSpec, Targets};
use crate::sql::{Db, LIMITED_QUEUES, READY_QUEUES};

/// Where `spec` claims this round (reading the ready queues when stale).
pub(crate) async fn targets(ctx: &ClaimContext, spec: &ClaimSpec) -> Result<Targets> {
    // Listed queues are tried by name: they need the limited queues only.
    let wants_ready = matches!(spec.queues, crate::plan::Queues::AllExcept(_));
    let (ready, limited) = ctx.ready_queues.get(ctx, wants_ready).await?;
    Ok(spec.targets(&ctx.cursor, &ready, &limited))
}

/// Claim rounds (of the whole worker) between two reads of the ready queues.
pub const REFRESH_ROUNDS: u32 = 16;

/// Most queues one read lists; queues beyond are served by the all-queues
/// statement that ends every round.
pub const LISTED_MAX: i64 = 1000;

/// The ready queues of one worker's all-queues claims.
#[derive(Debug, Default)]
pub(crate) struct ReadyQueues {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queues: Vec<String>,
    /// Queues with a max_running or rate limit (claimed with the slot
    /// statement), and whether each has a rate limit.
    limited: HashMap<String, bool>,
    /// Rounds since the last read; `None`: read at the next round.
    rounds: Option<u32>,
    /// Whether any spec claims "every queue" and so needs the ready
    /// queues: a worker with listed queues only reads just the limited ones
    /// (a scan of the queue index they would not use).
    wants_ready: bool,
    /// A read is under way: other claim tasks go on with the list they have
    /// rather than read it too (a notification after idle wakes every task
    /// at once, and each read on the burst's critical path). Safe with a
    /// stale list: the claim statements check pause and limits themselves.
    reading: bool,
}

/// Clears [`State::reading`] however the read ends.
struct Reading<'a>(&'a Mutex<State>);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.lock().expect("ready queues lock").reading = false;
    }
}

impl ReadyQueues {
    /// The queues with ready jobs (re-read when stale; empty unless some
    /// caller asked for them with `wants_ready`) and the limited queues
    /// (`true`: rate-limited).
    pub async fn get(
        &self,
        ctx: &ClaimContext,
        wants_ready: bool,
    ) -> Result<(Vec<String>, HashMap<String, bool>)> {
        let read_ready = {
            let mut s = self.state.lock().expect("ready queues lock");
            // A list read without the ready queues cannot serve a caller
            // that wants them.
            let fresh = !wants_ready || s.wants_ready;
            s.wants_ready |= wants_ready;
            if let Some(r) = s.rounds.as_mut().filter(|r| fresh && **r < REFRESH_ROUNDS) {
                *r += 1;
                return Ok((s.queues.clone(), s.limited.clone()));
            }
            if s.reading {
                return Ok((s.queues.clone(), s.limited.clone()));
            }
            s.reading = true;
            s.wants_ready
        };
        let _reading = Reading(&self.state);
        let mut conn = PooledConn::get(&ctx.pool, "claim: no connection to list queues").await?;
        let db = Db::pooled(&conn, ctx.config.prepared_statements);
        // Every ready queue (each spec keeps those it claims: plan.rs), so
        // that one read serves every spec of the worker.
        let none: &[String] = &[];
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&none, &LISTED_MAX];
        let (ready, limited) = tokio::join!(
            async {
                if read_ready {
                    db.query(&READY_QUEUES, &params).await
                } else {
                    Ok(Vec::new())
                }
            },
            db.query(&LIMITED_QUEUES, &[])
        );
        let limited: HashMap<String, bool> = conn
            .check(limited)
            .map_err(Error::db("claim: list limited queues"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let ready: Vec<String> = conn
            .check(ready)
            .map_err(Error::db("claim: list ready queues"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut s = self.state.lock().expect("ready queues lock");
        s.queues = ready;
        s.limited = limited;
        s.rounds = Some(0);
        Ok((s.queues.clone(), s.limited.clone()))
    }

    /// Whether `queue` was limited (max_running or rate) at the last read.
    pub fn is_limited(&self, queue: &str) -> bool {
        self.state
            .lock()
            .expect("ready queues lock")
            .limited
            .contains_key(queue)
    }

    /// A round found nothing: read the list again next time.
    pub fn invalidate(&self) {
        self.state.lock().expect("ready queues lock").rounds = None;
    }
}
