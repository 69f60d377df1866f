//! Claims that resume after the last job claimed, under database pressure
//! (issue 35, item 1).
//!
//! A claim walks the claim index from its head. Each job a claim takes
//! leaves its index entry behind until vacuum removes it, and while the
//! vacuum horizon is held (a forgotten `BEGIN`, a long report, a slot) no
//! claim can even mark those entries dead: every claim walks every entry of
//! every job claimed since the horizon stopped, and the claims take the
//! server's cores from the producers (docs/src/performance.md, "Under a
//! pinned vacuum horizon": 0.125 → 10.9 ms a claim, producers 1,500 → 240
//! inserts/s). So while the governor says the database is under pressure
//! (`Health::claims_resume`), the all-queues claims of both modes and the
//! claims of one queue by name start after the last job this worker claimed
//! there (`claim_tx_all_after`, `claim_lease_all_after`,
//! `claim_tx_queue_after`, `claim_lease_queue_after`: an index bound)
//! instead of at the head, and only one claim per
//! [`WorkerConfig::pressure_head_scan_every`](crate::WorkerConfig) (1 s)
//! starts at the head. A head claim walks every entry the pin keeps, so it
//! grows with the pin (12–16 ms a claim over three pinned minutes at 1,500
//! jobs/s, and more the longer it lasts): the next one comes at least
//! [`HEAD_SHARE`] times its duration later, so that head claims take at
//! most a fiftieth of a connection's time however long the pin lasts.
//!
//! ```text
//!  not under pressure: every claim from the head (the cursor kept up to date)
//!  under pressure:     head claim ──▶ cursor = its last job
//!                      claims within head_every: after the cursor
//!                         (cursor = the furthest job they took)
//!                      head_every later (or 50 × the last head claim's
//!                         duration, if longer): a head claim again
//! ```
//!
//! What a claim after the cursor cannot see waits for the next head claim
//! (at most `head_every`, while a claim task is awake): jobs that sort
//! before the cursor — a producer's job committed late (its `run_at` is
//! its transaction's start), a job released by its ordering key, a rescued
//! lease, the jobs of a rolled-back claim, a new job of a higher priority.
//! Only under pressure, where the alternative is every claim paying for the
//! pinned horizon.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use crate::claim::choose::plan::ClaimSpec;
use crate::claim::run::row::{ClaimRow, Mode};
use crate::db::sql::{Db, Sql};

/// A job's place in claim order: (priority, run_at, id).
pub(crate) type Key = (i32, DateTime<Utc>, i64);

/// How far behind the last job claimed a claim resumes, in `run_at`: a
/// producer's job takes its `run_at` when its statement starts and becomes
/// visible when its transaction commits, so with several producers a job
/// committed a moment after a later-stamped one sorts behind the cursor.
/// Resuming this far back takes those at once (the claim walks this much
/// of the index again, about 375 entries at 1,500 jobs/s); later ones wait
/// for the next claim from the head.
pub(crate) const LAG: Duration = Duration::from_millis(250);

/// Under pressure, the next claim from the head comes at least this many
/// times the last one's duration after it (and at least `head_every`): a
/// head claim at 20 ms, one a second; at 200 ms, one per 10 s.
pub(crate) const HEAD_SHARE: u32 = 50;

/// The claim key of a claimed row: priority, run_at, id.
pub(crate) fn key_of(row: ClaimRow<'_>) -> Key {
    row.order()
}

/// Each claim spec's cursors: one for its all-queues claims, one per queue
/// it claims by name (`queue = $2`, the index (queue, priority, run_at,
/// id), where a queue's claimed jobs leave their entries at the head of
/// its range just the same).
#[derive(Debug, Default)]
pub(crate) struct ClaimCursors {
    /// By spec (its address: the specs live in the claim context's plan for
    /// the worker's life).
    state: Mutex<HashMap<usize, SpecCursors>>,
}

/// Most per-queue cursors one spec keeps; past it they are all dropped (a
/// worker serving queues named per tenant would otherwise keep one for
/// every queue it ever claimed from) and the next claim of each queue
/// starts at the head.
const QUEUE_CURSORS_MAX: usize = 10_000;

#[derive(Debug, Default)]
struct SpecCursors {
    all: Cursor,
    queues: HashMap<String, Cursor>,
}

impl SpecCursors {
    fn of(&mut self, queue: Option<&str>) -> &mut Cursor {
        match queue {
            None => &mut self.all,
            Some(q) => {
                if !self.queues.contains_key(q) && self.queues.len() >= QUEUE_CURSORS_MAX {
                    self.queues.clear();
                }
                self.queues.entry(q.to_string()).or_default()
            }
        }
    }
}

#[derive(Debug, Default)]
struct Cursor {
    /// The last job claimed, in claim order.
    after: Option<Key>,
    /// When the last claim from the head was sent.
    head_at: Option<Instant>,
    /// How long the last claim from the head under pressure took (zero
    /// while not under pressure).
    head_took: Duration,
}

/// How claims of one round use the cursors.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CursorUse<'a> {
    pub cursors: &'a ClaimCursors,
    /// While claims resume after the cursor (`ClaimContext::pressure_throttle`:
    /// under pressure), one claim from the head per this long; `None`:
    /// every claim from the head.
    pub head_every: Option<Duration>,
}

impl ClaimCursors {
    /// Where a claim of `spec` (over every queue, or from `queue`) sent
    /// `now` starts: after the returned key, or at the head (`None`,
    /// recorded as the last head claim of that cursor). After the cursor
    /// only under pressure (`head_every` given), with a cursor known and a
    /// head claim within `head_every`.
    pub(crate) fn start(
        &self,
        spec: &ClaimSpec,
        queue: Option<&str>,
        head_every: Option<Duration>,
        now: Instant,
    ) -> Option<Key> {
        self.with(spec, queue, |c| {
            match head_every {
                Some(head_every) => {
                    if let (Some((priority, run_at, _)), Some(at)) = (c.after, c.head_at) {
                        if now.saturating_duration_since(at)
                            < head_every.max(c.head_took * HEAD_SHARE)
                        {
                            let lag = chrono::Duration::from_std(LAG).expect("a small duration");
                            return Some((priority, run_at - lag, i64::MIN));
                        }
                    }
                }
                // A pressure that begins later starts from head_every.
                None => c.head_took = Duration::ZERO,
            }
            c.head_at = Some(now);
            None
        })
    }

    /// `f` on the cursor of `spec`'s claims over every queue, or from
    /// `queue`.
    fn with<R>(
        &self,
        spec: &ClaimSpec,
        queue: Option<&str>,
        f: impl FnOnce(&mut Cursor) -> R,
    ) -> R {
        let mut state = self.state.lock().expect("claim cursors");
        f(state
            .entry(spec as *const ClaimSpec as usize)
            .or_default()
            .of(queue))
    }

    /// One claim of `spec` (over every queue, or from `queue`) through its
    /// cursor: `head` with `params` from the head of the index, or, under
    /// pressure (`head_every`, see [`ClaimCursors::start`]), `after` with
    /// `params` and the cursor's key; then the cursor moves on to the last
    /// job taken (its rows read as `mode`'s).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn claim(
        &self,
        db: Db<'_>,
        spec: &ClaimSpec,
        queue: Option<&str>,
        head_every: Option<Duration>,
        mode: Mode,
        (head, after): (&Sql, &Sql),
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let sent = Instant::now();
        let from = self.start(spec, queue, head_every, sent);
        let rows = match &from {
            None => db.query(head, params).await?,
            Some((priority, run_at, id)) => {
                let mut with_key = params.to_vec();
                with_key.extend([
                    priority as &(dyn tokio_postgres::types::ToSql + Sync),
                    run_at,
                    id,
                ]);
                db.query(after, &with_key).await?
            }
        };
        // Under pressure, how long a claim from the head took (its walk
        // over the entries the pin keeps): it spaces the next one.
        let head_took = (from.is_none() && head_every.is_some()).then(|| sent.elapsed());
        self.claimed(
            spec,
            queue,
            from.is_some(),
            rows.iter().map(|r| key_of(ClaimRow::read(r, mode))).max(),
            head_took,
        );
        Ok(rows)
    }

    /// A claim of `spec` (over every queue, or from `queue`; after a
    /// cursor, or from the head) took jobs up to `last` in claim order, and,
    /// from the head under pressure, `head_took`. A head claim sets the
    /// cursor to its last job (there may be jobs after it that it had no
    /// room for); a claim after the cursor moves it on, never back (claims
    /// in flight at once finish in any order).
    pub(crate) fn claimed(
        &self,
        spec: &ClaimSpec,
        queue: Option<&str>,
        after_cursor: bool,
        last: Option<Key>,
        head_took: Option<Duration>,
    ) {
        if last.is_none() && head_took.is_none() {
            return;
        }
        self.with(spec, queue, |c| {
            if let Some(took) = head_took {
                c.head_took = took;
            }
            if let Some(last) = last {
                c.after = Some(match (after_cursor, c.after) {
                    (true, Some(a)) => a.max(last),
                    _ => last,
                });
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{ClaimCursors, Key};
    use crate::claim::choose::plan::{ClaimSpec, Queues};
    use crate::handler::Delivery;
    use chrono::{TimeZone, Utc};
    use std::time::{Duration, Instant};

    fn key(id: i64) -> Key {
        (
            0,
            Utc.timestamp_opt(1_700_000_000, 0).unwrap() + chrono::Duration::seconds(id),
            id,
        )
    }

    /// A tx-mode spec over every queue.
    fn spec() -> ClaimSpec {
        ClaimSpec {
            mode: Delivery::Tx,
            queues: Queues::AllExcept(Vec::new()),
            tasks_in: None,
            tasks_not_in: Vec::new(),
        }
    }

    /// Where a claim resumes after `key(id)`: LAG before its run_at.
    fn lagged(id: i64) -> Key {
        let (p, r, _) = key(id);
        (
            p,
            r - chrono::Duration::from_std(super::LAG).unwrap(),
            i64::MIN,
        )
    }

    #[test]
    fn under_pressure_claims_resume_after_the_cursor_and_the_head_comes_back() {
        let spec = spec();
        let c = ClaimCursors::default();
        let every = Duration::from_secs(1);
        let t0 = Instant::now();
        assert_eq!(c.start(&spec, None, Some(every), t0), None, "no cursor yet");
        c.claimed(&spec, None, false, Some(key(10)), None);
        assert_eq!(
            c.start(&spec, None, None, t0),
            None,
            "no pressure: the head"
        );
        assert_eq!(
            c.start(&spec, None, Some(every), t0 + every / 2),
            Some(lagged(10)),
            "under pressure, within the head's period: after the cursor"
        );
        c.claimed(&spec, None, true, Some(key(20)), None);
        c.claimed(&spec, None, true, Some(key(15)), None);
        assert_eq!(
            c.start(&spec, None, Some(every), t0 + every / 2),
            Some(lagged(20)),
            "claims in flight at once never move it back"
        );
        c.claimed(&spec, None, true, None, None);
        assert_eq!(
            c.start(&spec, None, Some(every), t0 + every),
            None,
            "the head again"
        );
        c.claimed(&spec, None, false, Some(key(5)), None);
        assert_eq!(
            c.start(&spec, None, Some(every), t0 + every + every / 2),
            Some(lagged(5)),
            "a head claim sets the cursor, back if it found jobs before it"
        );
    }

    #[test]
    fn a_slow_head_claim_puts_the_next_one_off_by_fifty_times_its_duration() {
        let spec = spec();
        let c = ClaimCursors::default();
        let every = Duration::from_secs(1);
        let t0 = Instant::now();
        assert_eq!(c.start(&spec, None, Some(every), t0), None);
        c.claimed(&spec, None, false, Some(key(10)), None);
        c.claimed(&spec, None, false, None, Some(Duration::from_millis(10)));
        assert_eq!(
            c.start(&spec, None, Some(every), t0 + every),
            None,
            "10 ms: the head again after head_every"
        );
        c.claimed(&spec, None, false, None, Some(Duration::from_millis(100)));
        let later = t0 + every;
        assert_eq!(
            c.start(
                &spec,
                None,
                Some(every),
                later + Duration::from_millis(4_900)
            ),
            Some(lagged(10)),
            "100 ms: not before 5 s"
        );
        assert_eq!(
            c.start(&spec, None, Some(every), later + Duration::from_secs(5)),
            None,
            "100 ms: the head again after 5 s"
        );
    }

    #[test]
    fn each_queue_claimed_by_name_has_a_cursor_of_its_own() {
        let spec = spec();
        let c = ClaimCursors::default();
        let every = Duration::from_secs(1);
        let t0 = Instant::now();
        assert_eq!(c.start(&spec, Some("a"), Some(every), t0), None);
        c.claimed(&spec, Some("a"), false, Some(key(10)), None);
        assert_eq!(
            c.start(&spec, Some("b"), Some(every), t0),
            None,
            "another queue starts at its head"
        );
        c.claimed(&spec, Some("b"), false, Some(key(3)), None);
        assert_eq!(
            c.start(&spec, None, Some(every), t0),
            None,
            "and so do the all-queues claims"
        );
        assert_eq!(c.start(&spec, Some("a"), Some(every), t0), Some(lagged(10)));
        assert_eq!(c.start(&spec, Some("b"), Some(every), t0), Some(lagged(3)));
    }
}
