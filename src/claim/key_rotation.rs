//! Where each fair-keys queue's rotation stands for this worker (migration
//! 0020): the last limit key a claim of the queue served. The claim passes
//! it to `pgwake.fair_key_jobs` (functions/claims.sql), which serves the
//! groups after it first, so successive claims of one worker go round every
//! key instead of starting from the first each time.
//!
//! ```text
//!   groups in rotation order: (keyless) k1 k2 … kn, then round again
//!   claim: after_key = cursor ──▶ jobs of the next groups, one each
//!   cursor ◀── the last key served (byte order, as the SQL's COLLATE "C")
//! ```
//!
//! Kept in memory, per worker: a restart starts from the first key, which
//! costs a key at most one extra turn. The bound the rotation guarantees
//! (a group with a ready job is served within ceil(groups / n) claims of n
//! jobs by one worker) does not depend on other workers.

use std::collections::HashMap;
use std::sync::Mutex;

/// The rotation's position per queue.
#[derive(Default)]
pub(crate) struct KeyCursors {
    last: Mutex<HashMap<String, String>>,
}

impl KeyCursors {
    /// The last key served of `queue` (`None`: start from the first).
    pub(crate) fn after(&self, queue: &str) -> Option<String> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(queue)
            .cloned()
    }

    /// A claim of `queue` that started after `after` served jobs of
    /// `keys` (`None`: a job without a key).
    pub(crate) fn served<'k>(
        &self,
        queue: &str,
        after: Option<&str>,
        keys: impl Iterator<Item = Option<&'k str>>,
    ) {
        let Some(next) = next_cursor(after, keys) else {
            return;
        };
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        match next {
            Some(k) => {
                last.insert(queue.to_string(), k.to_string());
            }
            None => {
                last.remove(queue);
            }
        }
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
        c.served("q", None, [Some("k")].into_iter());
        assert_eq!(c.after("q").as_deref(), Some("k"));
        c.served("q", Some("k"), std::iter::empty());
        assert_eq!(c.after("q").as_deref(), Some("k"));
    }
}
