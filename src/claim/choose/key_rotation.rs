//! Where each fair-keys queue's rotation stands for this worker (migration
//! 0020): the last limit key a claim of the queue served. The claim passes
//! it to `pgwake.fair_key_jobs` (functions/claims.sql), which serves the
//! groups after it first, so successive claims of one worker go round every
//! key instead of starting from the first each time.
//!
//! ```text
//!   groups in rotation order: (keyless) k1 k2 … kn, then round again
//!   claim: after_key = cursor ──▶ jobs of the next groups, one each
//!   cursor ◀── the last key served (byte order, as the SQL's COLLATE "C"),
//!              or the key where the walk stopped at the bound
//! ```
//!
//! One call (a per-key rate's reservation, a claim) passes over at most
//! `pgwake.key_walk_bound()` keys (128; visits without taking: a key at its
//! limit or rate) and then reports the last key it visited: the cursor goes
//! there, so the next call resumes after it (migration 0023). Before, one
//! call visited every key (10,000 keys at their rate: 4.6 s a reservation).
//! A walk cut by the bound that took nothing may leave ready keys behind
//! the bound, which no event may announce: the worker claims again at once
//! ([`KeyCursors::served`] returns `true`), until those calls have come
//! round the whole rotation (a lap), and then waits as a claim that found
//! nothing does.
//!
//! Kept in memory, per worker: a restart starts from the first key, which
//! costs a key at most one extra turn. The bound the rotation guarantees
//! (a group with a ready job is served within ceil(groups / min(n, bound))
//! claims of n jobs by one worker) does not depend on other workers.

use std::collections::HashMap;
use std::sync::Mutex;

/// The rotation's position per queue.
#[derive(Default)]
pub(crate) struct KeyCursors {
    state: Mutex<Cursors>,
}

#[derive(Default)]
struct Cursors {
    /// The last key served (or where a walk stopped), per queue.
    last: HashMap<String, String>,
    /// Per queue, where the current run of walks cut by the bound that
    /// took nothing started (`None`: the start of the rotation).
    lap: HashMap<String, Option<String>>,
}

impl KeyCursors {
    /// The last key served of `queue` (`None`: start from the first).
    pub(crate) fn after(&self, queue: &str) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .last
            .get(queue)
            .cloned()
    }

    /// A claim of `queue` that started after `after` served jobs of
    /// `keys` (`None`: a job without a key); `stop`: the key where its walk
    /// (or its reservation's) stopped at the bound of keys passed over.
    /// Returns whether to claim again at once: the walk was cut, took
    /// nothing, and the walks cut since the last that took something have
    /// not yet come round the whole rotation.
    pub(crate) fn served<'k>(
        &self,
        queue: &str,
        after: Option<&str>,
        keys: impl Iterator<Item = Option<&'k str>>,
        stop: Option<&str>,
    ) -> bool {
        let mut keys = keys.peekable();
        let took = keys.peek().is_some();
        let next = match stop {
            Some(s) => Some(Some(s)),
            None => next_cursor(after, keys),
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        match next {
            Some(Some(k)) => {
                state.last.insert(queue.to_string(), k.to_string());
            }
            Some(None) => {
                state.last.remove(queue);
            }
            None => {}
        }
        let Some(stop) = stop.filter(|_| !took) else {
            state.lap.remove(queue);
            return false;
        };
        let from = state
            .lap
            .entry(queue.to_string())
            .or_insert_with(|| after.map(String::from))
            .clone();
        if passes(after, stop, from.as_deref()) {
            state.lap.remove(queue);
            return false;
        }
        true
    }
}

/// Whether a walk that started after `after` and stopped at `stop` (in
/// rotation order: the keys after `after`, the keyless group, the keys up
/// to `after`) went past position `p` (a key, or `None`: the start, before
/// the first key).
fn passes(after: Option<&str>, stop: &str, p: Option<&str>) -> bool {
    let stop = stop.as_bytes();
    match after.map(str::as_bytes) {
        // Wrapped round: past the end (so the start), then up to stop.
        Some(a) if stop <= a => p.is_none_or(|p| p.as_bytes() > a || p.as_bytes() <= stop),
        // Not wrapped round: the keys in (after, stop].
        a => p.is_some_and(|p| a.is_none_or(|a| p.as_bytes() > a) && p.as_bytes() <= stop),
    }
}

/// Where the rotation stands after a claim that started after `after` and
/// took jobs of `keys`. `pgwake.fair_key_jobs` visits the keys after
/// `after`, then the keyless group, then the keys up to `after`: the last
/// group it served is the greatest key at or before `after` when it
/// wrapped round to those, else the keyless group (the cursor goes back to
/// the start) when it got there, else the greatest key it served. A claim
/// that took nothing leaves the cursor where it was (`None`).
fn next_cursor<'k>(
    after: Option<&str>,
    keys: impl Iterator<Item = Option<&'k str>>,
) -> Option<Option<&'k str>> {
    let mut keyless = false;
    let mut any = false;
    let mut wrapped: Option<&str> = None;
    let mut ahead: Option<&str> = None;
    for k in keys {
        any = true;
        match k {
            None => keyless = true,
            Some(k) if after.is_some_and(|a| k.as_bytes() <= a.as_bytes()) => {
                wrapped = wrapped.max(Some(k));
            }
            Some(k) => ahead = ahead.max(Some(k)),
        }
    }
    if !any {
        return None;
    }
    Some(if wrapped.is_some() {
        wrapped
    } else if keyless {
        None
    } else {
        ahead
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn next(after: Option<&str>, keys: &[Option<&'static str>]) -> Option<&'static str> {
        next_cursor(after, keys.iter().copied()).expect("took jobs")
    }

    #[test]
    fn the_cursor_is_the_last_group_served_in_rotation_order() {
        // From the start: the greatest key served.
        assert_eq!(next(None, &[Some("a"), Some("c"), Some("b")]), Some("c"));
        // After "b": "c", "d", then wrapped round to the keyless group and "a".
        assert_eq!(
            next(Some("b"), &[Some("c"), Some("d"), None, Some("a")]),
            Some("a")
        );
        // Reached the keyless group last: back to the start.
        assert_eq!(next(Some("b"), &[Some("c"), None]), None);
        // Byte order, as COLLATE "C": "B" < "a".
        assert_eq!(next(Some("a"), &[Some("b"), Some("B")]), Some("B"));
    }

    #[test]
    fn a_claim_that_took_nothing_keeps_the_cursor() {
        let c = KeyCursors::default();
        c.served("q", None, [Some("k")].into_iter(), None);
        assert_eq!(c.after("q").as_deref(), Some("k"));
        c.served("q", Some("k"), std::iter::empty(), None);
        assert_eq!(c.after("q").as_deref(), Some("k"));
    }

    #[test]
    fn a_walk_cut_at_the_bound_moves_the_cursor_to_where_it_stopped() {
        let c = KeyCursors::default();
        // Took jobs of "b" and "c", stopped at "m": resume after "m".
        assert!(!c.served(
            "q",
            Some("a"),
            [Some("b"), Some("c")].into_iter(),
            Some("m")
        ));
        assert_eq!(c.after("q").as_deref(), Some("m"));
        // Took nothing: still moves on, and claims again at once.
        assert!(c.served("q", Some("m"), std::iter::empty(), Some("t")));
        assert_eq!(c.after("q").as_deref(), Some("t"));
    }

    /// Walks cut at the bound that take nothing claim again until they have
    /// come round the whole rotation, then stop; a claim that takes
    /// something starts the count again.
    #[test]
    fn fruitless_cut_walks_claim_again_for_one_lap() {
        let c = KeyCursors::default();
        let fruitless =
            |after: Option<&str>, stop: &str| c.served("q", after, std::iter::empty(), Some(stop));
        assert!(fruitless(Some("d"), "h"));
        assert!(fruitless(Some("h"), "p"));
        // Wrapped round to "b": not yet back at "d".
        assert!(fruitless(Some("p"), "b"));
        // Past "d": a lap.
        assert!(!fruitless(Some("b"), "f"));
        // The next run counts from where it starts.
        assert!(fruitless(Some("f"), "k"));
        assert!(!c.served("q", Some("k"), [Some("m")].into_iter(), Some("n")));
        assert!(fruitless(Some("n"), "r"));
        // From the start: a lap once a walk wraps round past the end.
        let c = KeyCursors::default();
        assert!(c.served("s", None, std::iter::empty(), Some("h")));
        assert!(c.served("s", Some("h"), std::iter::empty(), Some("x")));
        assert!(!c.served("s", Some("x"), std::iter::empty(), Some("a")));
    }

    #[test]
    fn a_walk_passes_the_positions_between_its_start_and_its_stop() {
        // Not wrapped: (after, stop].
        assert!(passes(Some("b"), "d", Some("d")));
        assert!(passes(Some("b"), "d", Some("c")));
        assert!(!passes(Some("b"), "d", Some("b")));
        assert!(!passes(Some("b"), "d", Some("e")));
        assert!(!passes(Some("b"), "d", None));
        assert!(passes(None, "d", Some("a")));
        assert!(!passes(None, "d", None));
        // Wrapped: after the end, the start, then up to stop.
        assert!(passes(Some("m"), "c", Some("x")));
        assert!(passes(Some("m"), "c", None));
        assert!(passes(Some("m"), "c", Some("c")));
        assert!(!passes(Some("m"), "c", Some("d")));
        assert!(!passes(Some("m"), "c", Some("m")));
        // Stopped at its own start: every key visited.
        assert!(passes(Some("m"), "m", Some("m")));
    }
}
