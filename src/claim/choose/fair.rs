//! Fair claims over every queue. The all-queues claim statement orders jobs
//! by (priority, run_at, id) across queues, so a deep backlog in one queue
//! would be served before a job inserted later into another. Instead, a
//! worker serving every queue keeps the list of queues that have ready jobs
//! (`db/sql/ready_queues.sql`, a loose index scan) and claims from them one
//! queue per statement, starting one queue further each round — as it does
//! for `--queues` lists — with the all-queues statement last, for queues
//! that appeared since the list was read.
//!
//! ```text
//!  round: list stale (≥ REFRESH_ROUNDS rounds, or the last round, started
//!         by a notification, poll or reconnect, found nothing; with no
//!         limited queue known the list is emptied instead, the next round
//!         claims without reading, and reads at once if it finds nothing)?
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
use std::time::{Duration, Instant};

use crate::claim::choose::plan::Rates;
use crate::config::PreparedStatements;
use crate::db::connect::PooledConn;
use crate::db::sql::{Db, LIMITED_QUEUES, READY_QUEUES};
use crate::error::{Error, Result};

/// Claim rounds (of the whole worker) between two reads of the ready queues.
pub(crate) const REFRESH_ROUNDS: u32 = 16;

/// Most queues one read lists; queues beyond are served by the all-queues
/// statement that ends every round.
pub(crate) const LISTED_MAX: i64 = 1000;

/// Under pressure, with no limited queue known at the last read, one read
/// of the ready queues per this many throttle periods (10 s at the default
/// `pressure_head_scan_every`). Each read walks the head of every queue's
/// range of the claim index, which a held horizon fills with entries no
/// read can skip (57 ms a read, up to 149 ms, over three pinned minutes at
/// 1,500 jobs/s: docs/src/performance.md, "Where the producers' latency
/// goes"). A stale list costs little then: the claims of a listed queue
/// resume after their cursor (cursor.rs), a new queue is taken by the
/// all-queues statement that ends every round, and only the rotation
/// between plain queues waits for the next read. With limited queues known
/// (claimed only when listed) the period stays one throttle.
pub(crate) const PLAIN_PRESSURE_PERIODS: u32 = 10;

/// The ready queues of one worker's all-queues claims.
#[derive(Debug, Default)]
pub(crate) struct ReadyQueues {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    queues: Vec<String>,
    /// Queues with a max_running or rate limit or per-key settings
    /// (claimed with the slot statement), and which rate limits each has.
    limited: HashMap<String, Rates>,
    /// Rounds since the last read; `None`: read at the next round.
    rounds: Option<u32>,
    /// Whether any spec claims "every queue" and so needs the ready
    /// queues: a worker with listed queues only reads just the limited ones
    /// (a scan of the queue index they would not use).
    wants_ready: bool,
    /// The list was emptied by [`State::found_nothing`] and not read since:
    /// the next round claims without it.
    unread: bool,
    /// Reads under way: other claim tasks go on with the list they have
    /// rather than read it too (a notification after idle wakes every task
    /// at once, and each read on the burst's critical path). Safe with a
    /// stale list: the claim statements check pause and limits themselves
    /// (but see `stale_since`).
    reading: usize,
    /// When the read whose lists these are began.
    read_started: Option<Instant>,
    /// A round that began then found nothing with a list read before it,
    /// limited queues known ([`State::found_nothing`]): the list may hide a
    /// limited queue that is ready now, so the next round reads even while
    /// another read is under way (that one may have begun before the event
    /// that started the round), and only a read begun after this instant
    /// counts as fresh.
    stale_since: Option<Instant>,
    /// Under database pressure: at most one read of the ready queues per
    /// this long, or per [`PLAIN_PRESSURE_PERIODS`] of it with no limited
    /// queue known (each walks the head of the claim index, which a held
    /// vacuum horizon fills with entries no read can skip: 0.1 → 29 ms a
    /// read in docs/src/performance.md, "Under a pinned vacuum horizon").
    /// Set by the caller for each call (`None`: no limit).
    throttle: Option<Duration>,
}

/// What a claim round does with the list.
#[derive(Debug, PartialEq)]
enum Next {
    /// Claim with this list (ready queues, limited queues).
    Use(Vec<String>, HashMap<String, Rates>),
    /// Read it first (the ready queues too, when `ready`).
    Read { ready: bool },
}

impl State {
    /// Count a round and say whether it reads the list first; a read
    /// returned here is the caller's to make ([`State::reading`] is set).
    fn next(&mut self, wants_ready: bool) -> Next {
        // A list read without the ready queues cannot serve a caller that
        // wants them.
        let fresh = !wants_ready || self.wants_ready;
        self.wants_ready |= wants_ready;
        let counted = match self.rounds.as_mut() {
            Some(r) if fresh && *r < REFRESH_ROUNDS => {
                *r += 1;
                true
            }
            _ => false,
        };
        if counted || (self.reading > 0 && self.stale_since.is_none()) || self.throttled() {
            return Next::Use(self.queues.clone(), self.limited.clone());
        }
        self.reading += 1;
        Next::Read {
            ready: self.wants_ready,
        }
    }

    /// A read begun at `started` ended with these lists. A read that began
    /// before the lists in hand (reads may overlap) is dropped.
    fn read(&mut self, started: Instant, queues: Vec<String>, limited: HashMap<String, Rates>) {
        if self.read_started.is_some_and(|s| s > started) {
            return;
        }
        self.queues = queues;
        self.limited = limited;
        self.read_started = Some(started);
        self.unread = false;
        if self.stale_since.is_some_and(|s| s > started) {
            // Found stale after this read began: the next round reads.
            self.rounds = None;
        } else {
            self.stale_since = None;
            self.rounds = Some(0);
        }
    }

    /// Whether a read now would come within [`State::throttle`] of the
    /// last one.
    fn throttled(&self) -> bool {
        match (self.throttle, self.read_started) {
            (Some(every), Some(at)) if self.limited.is_empty() => {
                at.elapsed() < every * PLAIN_PRESSURE_PERIODS
            }
            (Some(every), Some(at)) => at.elapsed() < every,
            _ => false,
        }
    }

    /// See [`ReadyQueues::found_nothing`].
    fn found_nothing(&mut self, round_started: Instant) -> bool {
        if self.unread {
            // This round (or another since the list was emptied) claimed
            // without reading it and found nothing: read it now; under
            // pressure, within the throttle, at the next event instead
            // (claiming again now would only find the read throttled).
            self.rounds = Some(REFRESH_ROUNDS);
            return !self.throttled();
        }
        if self.rounds.is_none() || !self.limited.is_empty() {
            // Limited queues are claimed only when the list shows them
            // ready (the plain claims skip them): read before claiming.
            self.rounds = None;
            // With a list read before this round began, a limited queue
            // that became ready since (the event that started this round)
            // is not in it, and no other event may come (no poll for
            // minutes): read and claim again now.
            if !self.limited.is_empty() && self.read_started.is_none_or(|s| s < round_started) {
                self.stale_since = Some(round_started);
                return !self.throttled();
            }
            return false;
        }
        self.queues.clear();
        self.unread = true;
        self.rounds = Some(REFRESH_ROUNDS - 1);
        false
    }
}

/// Counts a read off [`State::reading`] however it ends.
struct Reading<'a>(&'a Mutex<State>);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.lock().expect("ready queues lock").reading -= 1;
    }
}

impl ReadyQueues {
    /// The queues with ready jobs (re-read when stale; empty unless some
    /// caller asked for them with `wants_ready`) and the limited queues
    /// (with their rate limits).
    pub(crate) async fn get(
        &self,
        pool: &deadpool_postgres::Pool,
        prepared: PreparedStatements,
        wants_ready: bool,
        throttle: Option<Duration>,
    ) -> Result<(Vec<String>, HashMap<String, Rates>)> {
        let next = {
            let mut s = self.state.lock().expect("ready queues lock");
            s.throttle = throttle;
            s.next(wants_ready)
        };
        let read_ready = match next {
            Next::Use(queues, limited) => return Ok((queues, limited)),
            Next::Read { ready } => ready,
        };
        let _reading = Reading(&self.state);
        let started = Instant::now();
        let mut conn = PooledConn::get(pool, "claim: no connection to list queues").await?;
        let db = Db::pooled(&conn, prepared);
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
        let limited: HashMap<String, Rates> = conn
            .check(limited)
            .map_err(Error::db("claim: list limited queues"))?
            .iter()
            .map(|r| {
                let rates = Rates {
                    queue: r.get(1),
                    per_key: r.get(2),
                };
                (r.get(0), rates)
            })
            .collect();
        let ready: Vec<String> = conn
            .check(ready)
            .map_err(Error::db("claim: list ready queues"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let mut s = self.state.lock().expect("ready queues lock");
        s.read(started, ready, limited);
        Ok((s.queues.clone(), s.limited.clone()))
    }

    /// Whether `queue` was limited (max_running or rate) at the last read.
    pub(crate) fn is_limited(&self, queue: &str) -> bool {
        self.state
            .lock()
            .expect("ready queues lock")
            .limited
            .contains_key(queue)
    }

    /// A round started by an event (a notification, a poll, a reconnect)
    /// found nothing in any queue. Returns whether the caller claims once
    /// more at once (that round reads the list).
    ///
    /// With no limited queue known, no queue had a claimable job: the list
    /// is emptied, and the next round (typically the wake-up of an idle
    /// worker for a new job) claims with the all-queues statement alone,
    /// without reading the list first. That read put a round trip on every
    /// idle pickup (`pgwake bench`: p50 1.08 against 0.72 ms before issue
    /// 10, one ready-queues read per pickup by `pg_stat_statements`). If
    /// that round finds nothing either, the job may be in a queue only a
    /// read shows (one limited since the last read: the plain claims skip
    /// it), and no event may come to start another round (no poll for
    /// minutes): so `true`, read and claim again now.
    ///
    /// With limited queues known, a limited queue is claimed only when the
    /// list shows it ready, so the next round reads first; and if this
    /// round (begun at `round_started`) claimed with a list read before it
    /// began, `true`: the queue may have become ready since (the event
    /// that started this round), so read and claim again now. Before, such
    /// a job waited for the next event (a poll: 2 s by default; in a test
    /// with polls 10 minutes apart, until another job's timeout).
    /// Under pressure (`throttle`: the least time between two reads),
    /// never `true` within the throttle of the last read: the next event
    /// (a notification, a poll) claims again.
    pub(crate) fn found_nothing(&self, round_started: Instant, throttle: Option<Duration>) -> bool {
        let mut s = self.state.lock().expect("ready queues lock");
        s.throttle = throttle;
        s.found_nothing(round_started)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A state after a read that listed `queues`.
    fn read(queues: &[&str]) -> State {
        let mut s = State::default();
        assert_eq!(s.next(true), Next::Read { ready: true });
        s.read(
            Instant::now(),
            queues.iter().map(|q| q.to_string()).collect(),
            HashMap::new(),
        );
        s.reading = 0;
        s
    }

    fn uses(s: &mut State) -> Vec<String> {
        match s.next(true) {
            Next::Use(queues, _) => queues,
            read => panic!("expected a round on the list, got {read:?}"),
        }
    }

    fn reads(s: &mut State) {
        assert_eq!(s.next(true), Next::Read { ready: true });
        s.reading = 0;
    }

    #[test]
    fn the_list_is_read_every_refresh_rounds() {
        let mut s = read(&["a", "b"]);
        for _ in 0..REFRESH_ROUNDS {
            assert_eq!(uses(&mut s), ["a", "b"]);
        }
        reads(&mut s);
    }

    /// The wake-up of an idle worker (the round after one that found
    /// nothing) claims at once, on an empty list; the round after it reads.
    #[test]
    fn after_a_round_that_found_nothing_the_next_claims_without_reading() {
        let mut s = read(&["a"]);
        assert!(!s.found_nothing(Instant::now()));
        assert!(
            uses(&mut s).is_empty(),
            "no queue had a job: the list is emptied"
        );
        reads(&mut s);
    }

    /// A queue only a fresh read shows (one limited while the worker idled:
    /// the plain claims skip it) must not wait for another event: a round
    /// on the emptied list that finds nothing claims again at once, and
    /// that round reads. In a CI run a limited queue's job waited 30 s
    /// (until another job's timeout woke a claim) with no poll.
    #[test]
    fn a_round_on_the_emptied_list_that_finds_nothing_claims_again_with_a_read() {
        let mut s = read(&[]);
        for _ in 0..3 {
            assert!(
                !s.found_nothing(Instant::now()),
                "the first empty round: go idle"
            );
            assert!(uses(&mut s).is_empty());
            assert!(s.found_nothing(Instant::now()), "claim again at once");
            reads(&mut s);
            s.read(Instant::now(), Vec::new(), HashMap::new());
        }
    }

    /// With limited queues known, a round after one that found nothing reads
    /// first: a limited queue is claimed only when listed ready. A round
    /// that read the list itself (begun before the read) goes idle.
    #[test]
    fn with_limited_queues_the_round_after_an_empty_one_reads_first() {
        let round = Instant::now();
        let mut s = read(&["a"]);
        s.limited.insert("lim".into(), Rates::default());
        assert!(!s.found_nothing(round), "a fresh list: go idle");
        reads(&mut s);
    }

    /// A round begun after the list was read (a notification's) that finds
    /// nothing claims again at once, and that round reads, even while an
    /// older read is under way; the older read's lists, landing after,
    /// do not count as fresh. Before, it went idle: the job of a limited
    /// queue the old list did not show waited for the next event.
    #[test]
    fn with_limited_queues_a_round_on_an_old_list_reads_and_claims_again() {
        let mut s = read(&["a"]);
        s.limited.insert("lim".into(), Rates::default());
        s.rounds = Some(REFRESH_ROUNDS);
        // A read begins (another task), then the notified round on the old list.
        let old_read = Instant::now();
        assert_eq!(s.next(true), Next::Read { ready: true });
        let round = Instant::now();
        assert!(s.found_nothing(round), "an old list: claim again at once");
        assert_eq!(
            s.next(true),
            Next::Read { ready: true },
            "the next round reads, though a read is under way"
        );
        s.read(old_read, vec!["a".into()], s.limited.clone());
        assert_eq!(s.rounds, None, "the older read is not fresh enough");
        let new_read = Instant::now();
        s.read(new_read, vec!["a".into(), "lim".into()], s.limited.clone());
        assert_eq!(s.rounds, Some(0));
        s.read(old_read, vec![], s.limited.clone());
        assert_eq!(
            s.queues,
            ["a", "lim"],
            "an older read landing late is dropped"
        );
    }

    /// Before the first read there is nothing to claim with: read.
    #[test]
    fn a_round_before_any_read_reads() {
        let mut s = State::default();
        assert!(!s.found_nothing(Instant::now()));
        reads(&mut s);
    }

    /// One read at a time: the others use the list they have.
    #[test]
    fn a_round_during_a_read_uses_the_list_it_has() {
        let mut s = read(&["a"]);
        s.rounds = Some(REFRESH_ROUNDS);
        assert_eq!(s.next(true), Next::Read { ready: true });
        assert_eq!(uses(&mut s), ["a"]);
    }

    #[test]
    fn under_pressure_a_list_without_limited_queues_is_read_ten_times_less_often() {
        let every = Duration::from_secs(1);
        let mut s = read(&["a", "b"]);
        s.throttle = Some(every);
        s.rounds = Some(REFRESH_ROUNDS);
        s.read_started = Some(Instant::now() - 2 * every);
        assert_eq!(
            s.next(true),
            Next::Use(vec!["a".into(), "b".into()], HashMap::new()),
            "no limited queue known: {PLAIN_PRESSURE_PERIODS} periods between reads"
        );
        s.limited.insert("l".into(), Rates::default());
        assert_eq!(
            s.next(true),
            Next::Read { ready: true },
            "a limited queue known: one period"
        );
        s.reading = 0;
        s.limited.clear();
        s.read_started = Some(Instant::now() - every * PLAIN_PRESSURE_PERIODS);
        assert_eq!(s.next(true), Next::Read { ready: true }, "ten periods on");
    }
}
