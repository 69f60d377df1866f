//! Lease-mode prefetch: jobs claimed ahead of the free slots wait here, so a
//! slot freed by a finished job starts the next one without a round trip.
//!
//! ```text
//!  lease claim ── free slots' jobs ──▶ run (lease::spawn_run)
//!       │            the rest ──▶ buffer ──▶ a finishing run takes the next
//!       ▲                            │         (same slot, no round trip)
//!       └── refill: below half ──────┘
//!  stalled: no start for `--prefetch-wait` (every slot busy with long
//!           jobs) → the buffer handed back, no claim ahead until a start
//!  shutdown: every buffered job handed back at once (attempt refunded,
//!            one requeue statement through the completer, fenced by token)
//! ```
//!
//! A buffered job is leased like a running one: its token is in the lease
//! book from claim time (the heartbeat renews it) and its id in the cancel
//! book (a cancel requested while it waits is seen when it would start).
//! When it starts, it starts only if its lease still holds (a lost lease:
//! dropped, never run) and no cancel came (buried as cancelled, never run);
//! its timeout counts from then. Limited and rate-limited queues are never
//! prefetched (lease.rs): a buffered job would hold a running slot or an
//! admission it does not use.
//!
//! A buffer only pays while slots free up: when every slot runs a long job,
//! a buffered job would wait for one of them while other workers sit idle.
//! So when no job has started for `--prefetch-wait` (1 s by default) and
//! jobs are buffered, the buffer goes back whole, like at shutdown, and the
//! worker claims no more ahead of its slots until one of them starts a job
//! again ([`Prefetch::take_stalled`]).
//!
//! On a crash (`kill -9`) a buffered job is not charged: its claim marked
//! it `buffered` (lease.rs passes the free slots as `run_now`), and the
//! rescuer refunds its attempt and marks it a suspect, which is then
//! claimed only onto a free slot (ARCHITECTURE.md, "Lease prefetch").

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::claim::run::cancels::Watch;
use crate::claim::run::claimed::Claimed;

/// A leased job, claimed, not started yet.
pub(crate) struct Leased {
    pub claimed: Claimed,
    /// Cancelled when its lease is lost.
    pub lost: CancellationToken,
    /// Its entry in the cancel book, from claim time.
    pub watch: Watch,
}

/// How much work the default buffer holds: the jobs this worker starts in
/// this long, at its measured rate (`--prefetch` unset). Long enough that
/// claims of no-op jobs grow to `--batch` (a claim and its commit take a
/// few milliseconds; docs/src/performance.md, "Lease prefetch sized by
/// rate"), short enough that a `kill -9` charges, and other workers wait
/// for, at most this much of the worker's work.
pub(crate) const HORIZON: Duration = Duration::from_millis(50);

/// A claim for the buffer takes at most this share of it (a third), or
/// what `--batch` leaves beside its free slots if that is more: the refill
/// of a large buffer asked for at half goes out as smaller claims, two in
/// flight at once (`LeaseTurn::for_worker`), each landing sooner, so the
/// buffer never runs dry behind one large claim. At 8 slots, no-op jobs,
/// claims for the whole room ran 34,784–39,452 jobs/s, a third of it
/// 42,232–48,573 (docs/src/performance.md, "Lease claims that keep up").
pub(crate) const CLAIM_SHARE: usize = 3;

/// How the buffer is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Size {
    /// At most this many jobs (`--prefetch N`; 0: off).
    Fixed(usize),
    /// The jobs started in [`HORIZON`] at the measured rate, between
    /// `floor` and `cap` (the default).
    ByRate { floor: usize, cap: usize },
}

impl Size {
    /// The size `--prefetch` asks for: `Some(n)` fixed (0: off), `None` by
    /// rate, from one job to [`PREFETCH_CAP_DEFAULT`](crate::config::PREFETCH_CAP_DEFAULT).
    pub(crate) fn of(prefetch: Option<usize>) -> Size {
        match prefetch {
            Some(n) => Size::Fixed(n),
            None => Size::ByRate {
                floor: 1,
                cap: crate::config::PREFETCH_CAP_DEFAULT,
            },
        }
    }

    /// The rule in words, for the worker's start line: `lease` says
    /// whether any task is claimed in lease mode (tx mode never buffers).
    /// A cap alone ("prefetch=200") read as 200 jobs held per worker,
    /// where the default holds one to a few at a slow rate.
    pub(crate) fn describe(self, lease: bool) -> String {
        if !lease {
            return "off (no lease-mode task)".into();
        }
        let unlimited = "; none for a limited or rate-limited queue";
        match self {
            Size::Fixed(0) => "off (--prefetch 0)".into(),
            Size::Fixed(n) => format!("{n} lease-mode jobs (--prefetch){unlimited}"),
            Size::ByRate { floor, cap } => format!(
                "the lease-mode jobs this worker starts in {}ms at its measured rate, \
                 {floor} to {cap}{unlimited}",
                HORIZON.as_millis()
            ),
        }
    }
}

/// Jobs started per second, averaged over windows of [`HORIZON`].
#[derive(Debug)]
struct StartRate {
    since: Instant,
    starts: u64,
    per_s: f64,
}

impl StartRate {
    fn new(now: Instant) -> StartRate {
        StartRate {
            since: now,
            starts: 0,
            per_s: 0.0,
        }
    }

    /// The rate as of `now`: each window of at least [`HORIZON`] counts
    /// half (an idle stretch is one window: the rate halves, then decays).
    fn at(&mut self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= HORIZON {
            let window = self.starts as f64 / elapsed.as_secs_f64();
            self.per_s = (self.per_s + window) / 2.0;
            self.since = now;
            self.starts = 0;
        }
        self.per_s
    }
}

/// The buffer of claimed, unstarted lease-mode jobs.
pub(crate) struct Prefetch {
    state: Mutex<State>,
    size: Size,
    /// A refill is wanted (the buffer dropped below half): a claim task
    /// waiting for a free slot claims for the buffer instead.
    pub(crate) refill: Notify,
}

/// The buffer and the claims in flight for it, under one lock: a claim
/// reserves its room and the next sees it taken.
struct State {
    /// Buffered jobs, each with when it was buffered.
    jobs: VecDeque<(Instant, Leased)>,
    /// Jobs asked for by the buffer claims in flight ([`Reserved`]).
    claiming: usize,
    started: StartRate,
    /// When a job last started on this worker.
    last_start: Instant,
    /// The buffer went back stalled: no claim ahead until a job starts.
    stalled: bool,
}

impl State {
    /// Jobs buffered or on their way.
    fn held(&self) -> usize {
        self.jobs.len() + self.claiming
    }
}

/// Room in the buffer taken by one claim in flight; given back when
/// dropped (after the claim's jobs are pushed, or on its error or panic).
pub(crate) struct Reserved<'a> {
    prefetch: &'a Prefetch,
    jobs: usize,
}

impl Reserved<'_> {
    /// How many jobs the claim may take for the buffer.
    pub(crate) fn jobs(&self) -> usize {
        self.jobs
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        self.prefetch.state().claiming -= self.jobs;
    }
}

impl Prefetch {
    /// A buffer of at most `cap` jobs (0: off).
    pub(crate) fn new(cap: usize) -> Prefetch {
        Prefetch::sized(Size::Fixed(cap))
    }

    /// A buffer sized by `size`.
    pub(crate) fn sized(size: Size) -> Prefetch {
        Prefetch {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                claiming: 0,
                started: StartRate::new(Instant::now()),
                last_start: Instant::now(),
                stalled: false,
            }),
            size,
            refill: Notify::new(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("prefetch buffer")
    }

    /// The buffer's size now (0 while stalled).
    fn target(&self, state: &mut State) -> usize {
        if state.stalled {
            return 0;
        }
        match self.size {
            Size::Fixed(cap) => cap,
            Size::ByRate { floor, cap } => {
                let per_s = state.started.at(Instant::now());
                let jobs = (per_s * HORIZON.as_secs_f64()).ceil() as usize;
                jobs.max(floor).min(cap)
            }
        }
    }

    /// A lease job starts (from the buffer or straight from its claim):
    /// a slot turns over, so claiming ahead pays again.
    pub(crate) fn started(&self) {
        let mut state = self.state();
        state.started.starts += 1;
        state.last_start = Instant::now();
        state.stalled = false;
    }

    /// Reserve room for a claim about to be sent: at most the larger of
    /// `batch_room` (what `--batch` leaves beside the claim's free slots)
    /// and a [`CLAIM_SHARE`] of the buffer, and no more than the buffer has
    /// room for once every claim in flight has landed. Several claims may
    /// be in flight at once (`LeaseTurn`): together they never take more
    /// than the buffer holds. A buffer within a batch is filled by one
    /// claim, as before the share; a larger one by claims of a third.
    pub(crate) fn reserve(&self, batch_room: usize) -> Reserved<'_> {
        let mut state = self.state();
        let target = self.target(&mut state);
        let jobs = target
            .saturating_sub(state.held())
            .min(target.div_ceil(CLAIM_SHARE).max(batch_room));
        state.claiming += jobs;
        Reserved {
            prefetch: self,
            jobs,
        }
    }

    /// The buffer's size now.
    #[cfg(test)]
    fn size_now(&self) -> usize {
        let mut state = self.state();
        self.target(&mut state)
    }

    /// Jobs buffered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.state().jobs.len()
    }

    /// Buffer a claimed job.
    pub(crate) fn push(&self, job: Leased) {
        self.state().jobs.push_back((Instant::now(), job));
    }

    /// The next job to start, in claim order. Asks for a refill when the
    /// jobs buffered are down to half, whatever claims are on their way (so
    /// a second claim goes out while the first is in flight: one claim
    /// statement at a time, on one backend, could not move the jobs of a
    /// fast worker); the caller then wakes a claim task, which may be
    /// idle. [`Prefetch::reserve`] keeps the claims in flight within the
    /// buffer.
    pub(crate) fn pop(&self) -> Option<(Leased, bool)> {
        let (job, buffered, target) = {
            let mut state = self.state();
            let job = state.jobs.pop_front();
            let target = self.target(&mut state);
            (job, state.jobs.len(), target)
        };
        let (_, job) = job?;
        let refill = buffered * 2 <= target;
        if refill {
            self.refill.notify_one();
        }
        Some((job, refill))
    }

    /// The buffered jobs whose cancel came, out of the buffer.
    pub(crate) fn take_cancelled(&self) -> Vec<Leased> {
        self.take_where(|_, j| j.watch.cancelled())
    }

    /// The buffered jobs whose queue `restricted` says became paused or
    /// limited since they were buffered, out of the buffer.
    pub(crate) fn take_restricted(
        &self,
        restricted: impl Fn(&str, Instant) -> bool,
    ) -> Vec<Leased> {
        self.take_where(|at, j| restricted(&j.claimed.job.queue, at))
    }

    /// The buffered jobs `take` picks (given when each was buffered), out
    /// of the buffer, in claim order.
    fn take_where(&self, take: impl Fn(Instant, &Leased) -> bool) -> Vec<Leased> {
        let mut state = self.state();
        let (taken, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut state.jobs)
            .into_iter()
            .partition(|(at, j)| take(*at, j));
        state.jobs = kept.into();
        taken.into_iter().map(|(_, j)| j).collect()
    }

    /// Every buffered job, emptying the buffer (shutdown: they go back).
    pub(crate) fn drain(&self) -> Vec<Leased> {
        self.state().jobs.drain(..).map(|(_, j)| j).collect()
    }

    /// Every buffered job if the buffer is stalled as of `now`: jobs
    /// buffered, and neither a start nor the oldest buffering within
    /// `wait` (every slot busy for that long). The buffer is then marked
    /// stalled, so no claim refills it until a job starts. Empty
    /// otherwise.
    pub(crate) fn take_stalled(&self, wait: Duration, now: Instant) -> Vec<Leased> {
        let mut state = self.state();
        let Some(&(oldest, _)) = state.jobs.front() else {
            return Vec::new();
        };
        if now.saturating_duration_since(oldest.max(state.last_start)) < wait {
            return Vec::new();
        }
        state.stalled = true;
        state.jobs.drain(..).map(|(_, j)| j).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::{Leased, Prefetch, Size, StartRate};
    use crate::claim::run::cancels::CancelBook;
    use crate::claim::run::claimed::Claimed;
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use tokio_util::sync::CancellationToken;

    #[test]
    fn an_empty_or_off_buffer_has_the_room_of_its_cap() {
        assert_eq!(Prefetch::new(0).reserve(100).jobs(), 0);
        assert_eq!(Prefetch::new(8).reserve(100).jobs(), 8, "within a batch");
        assert_eq!(Prefetch::new(9).reserve(2).jobs(), 3, "a third of it");
        assert_eq!(
            Prefetch::new(9).reserve(5).jobs(),
            5,
            "what the batch leaves"
        );
        assert_eq!(Prefetch::new(1).reserve(0).jobs(), 1);
        assert!(Prefetch::new(8).pop().is_none());
        assert!(Prefetch::new(8).drain().is_empty());
        assert_eq!(Prefetch::new(8).len(), 0);
    }

    #[test]
    fn a_buffer_sized_by_rate_holds_the_starts_of_its_horizon_within_its_bounds() {
        let t0 = Instant::now();
        let mut r = StartRate::new(t0);
        assert_eq!(r.at(t0), 0.0, "no rate before a window has passed");
        r.starts = 100;
        // 100 starts in 100 ms: 1,000/s, averaged with the 0 before.
        assert_eq!(r.at(t0 + Duration::from_millis(100)), 500.0);
        r.starts = 100;
        assert_eq!(r.at(t0 + Duration::from_millis(200)), 750.0);
        // An idle second halves it.
        assert_eq!(r.at(t0 + Duration::from_millis(1200)), 375.0);

        let p = Prefetch::sized(Size::ByRate { floor: 8, cap: 200 });
        assert_eq!(p.size_now(), 8, "the floor before any start");
        let p = Prefetch::sized(Size::ByRate { floor: 8, cap: 200 });
        {
            let mut s = p.state();
            s.started.per_s = 100_000.0;
            s.started.since = Instant::now();
        }
        assert_eq!(p.size_now(), 200, "the cap at 100,000 starts/s");
        let p = Prefetch::sized(Size::ByRate { floor: 8, cap: 200 });
        {
            let mut s = p.state();
            s.started.per_s = 1_000.0;
            s.started.since = Instant::now();
        }
        assert_eq!(p.size_now(), 50, "50 ms of 1,000 starts/s");
        let p = Prefetch::sized(Size::ByRate {
            floor: 300,
            cap: 200,
        });
        assert_eq!(p.size_now(), 200, "never above the cap");
    }

    fn leased(book: &Arc<CancelBook>, id: i64) -> Leased {
        let lost = CancellationToken::new();
        Leased {
            claimed: Claimed::for_tests(id),
            watch: book.watch(id, &lost),
            lost,
        }
    }

    /// A buffer goes back only when no job started and none was buffered
    /// within the wait; then nothing is claimed ahead until a job starts.
    #[test]
    fn a_stalled_buffer_goes_back_whole_and_is_not_refilled_until_a_start() {
        let book = Arc::new(CancelBook::default());
        let wait = Duration::from_secs(1);
        let p = Prefetch::new(8);
        let t0 = Instant::now();
        assert!(p.take_stalled(wait, t0 + wait * 5).is_empty(), "empty");
        p.push(leased(&book, 1));
        p.push(leased(&book, 2));
        let pushed = Instant::now();
        assert!(
            p.take_stalled(wait, pushed + wait / 2).is_empty(),
            "buffered within the wait"
        );
        p.started();
        let start = Instant::now();
        assert!(
            p.take_stalled(wait, start + wait / 2).is_empty(),
            "a start within the wait: the slots turn over"
        );
        let back = p.take_stalled(wait, start + wait);
        assert_eq!(
            back.iter().map(|l| l.claimed.job.id).collect::<Vec<_>>(),
            vec![1, 2],
            "no start for the wait: every buffered job goes back"
        );
        assert_eq!(p.len(), 0);
        assert_eq!(p.reserve(100).jobs(), 0, "no claim ahead while stalled");
        p.started();
        assert_eq!(p.size_now(), 8, "a start ends the stall");
    }

    #[test]
    fn claims_in_flight_at_once_never_reserve_more_than_the_buffer_holds() {
        let p = Prefetch::new(9);
        let (a, b, c) = (p.reserve(1), p.reserve(1), p.reserve(1));
        assert_eq!((a.jobs(), b.jobs(), c.jobs()), (3, 3, 3), "a third each");
        assert_eq!(p.reserve(100).jobs(), 0, "the claims took the room");
        drop(a);
        let (d, e) = (p.reserve(1), p.reserve(1));
        assert_eq!((d.jobs(), e.jobs()), (3, 0));
        drop((b, c, d, e));
        assert_eq!(p.reserve(100).jobs(), 9, "room given back when claims land");
    }

    #[test]
    fn a_refill_is_asked_for_at_half_the_buffer_while_a_claim_is_in_flight() {
        // One claim on its way must not hold back the next: a buffer that
        // waited for it to land ran dry behind one claim statement at a time.
        let book = Arc::new(CancelBook::default());
        let p = Prefetch::new(4);
        for id in 0..4 {
            p.push(leased(&book, id));
        }
        let (_, refill) = p.pop().expect("a buffered job");
        assert!(!refill, "three of four still buffered: no refill yet");
        let (_, refill) = p.pop().expect("a buffered job");
        assert!(refill, "down to half: refill");
        let in_flight = p.reserve(0);
        assert_eq!(in_flight.jobs(), 2, "the room, within a third of 4 (2)");
        let (_, refill) = p.pop().expect("a buffered job");
        assert!(refill, "one of four buffered, a claim in flight: refill");
    }
}
