//! The claim path's side of the per-minute rollup: each run's outcome is
//! counted here, in memory, by `ClaimContext::report` (one short mutex
//! hold, no statement); `services/rollup.rs` takes the counts every few
//! seconds and adds them into `pgwake.minute_stats`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most distinct rows a tally holds. Counts that would add a row beyond it
/// while the database is unreachable are dropped (and logged): memory stays
/// bounded whatever the outage.
pub(crate) const ROWS_MAX: usize = 100_000;

/// One row's key: epoch minute, queue, task, outcome.
pub(crate) type Key = (i64, String, String, &'static str);

/// One row's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Counts {
    pub jobs: i64,
    pub pickup_sum: f64,
    pub pickup_max: f64,
}

impl Counts {
    pub(crate) fn add(&mut self, other: Counts) {
        self.jobs += other.jobs;
        self.pickup_sum += other.pickup_sum;
        self.pickup_max = self.pickup_max.max(other.pickup_max);
    }
}

/// A worker's counts since the last flush. Shared by the claim path (which
/// counts) and the rollup service (which takes them).
#[derive(Debug, Default)]
pub(crate) struct Tally {
    rows: Mutex<HashMap<Key, Counts>>,
}

impl Tally {
    /// Count one run of `queue`/`task` that ended with `outcome`, `pickup`
    /// seconds after it became ready.
    pub(crate) fn count(&self, queue: &str, task: &str, outcome: &'static str, pickup: f64) {
        let minute = epoch_minute(SystemTime::now());
        self.add(
            (minute, queue.to_owned(), task.to_owned(), outcome),
            Counts {
                jobs: 1,
                pickup_sum: pickup,
                pickup_max: pickup,
            },
        );
    }

    fn add(&self, key: Key, counts: Counts) {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let full = rows.len() >= ROWS_MAX;
        match rows.get_mut(&key) {
            Some(c) => c.add(counts),
            None if full => {
                tracing::warn!(
                    queue = %key.1,
                    "rollup: {ROWS_MAX} rows of counts not flushed yet; dropping a count (is the database reachable?)"
                );
            }
            None => {
                rows.insert(key, counts);
            }
        }
    }

    /// Everything counted so far, sorted by key; the tally is left empty.
    pub(crate) fn take(&self) -> Vec<(Key, Counts)> {
        let taken = std::mem::take(&mut *self.rows.lock().unwrap_or_else(|p| p.into_inner()));
        let mut rows: Vec<_> = taken.into_iter().collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }

    /// Put back counts a flush could not write.
    pub(crate) fn restore(&self, rows: Vec<(Key, Counts)>) {
        for (k, c) in rows {
            self.add(k, c);
        }
    }
}

fn epoch_minute(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64 / 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_adds_runs_of_one_key_into_one_row() {
        let t = Tally::default();
        t.count("q", "a", "done", 0.5);
        t.count("q", "a", "done", 1.5);
        t.count("q", "a", "retry", 0.25);
        let rows = t.take();
        assert_eq!(rows.len(), 2);
        let done = rows.iter().find(|(k, _)| k.3 == "done").unwrap().1;
        assert_eq!(done.jobs, 2);
        assert_eq!(done.pickup_sum, 2.0);
        assert_eq!(done.pickup_max, 1.5);
        assert!(t.take().is_empty(), "take leaves the tally empty");
        t.restore(rows);
        assert_eq!(t.take().len(), 2, "restored counts are flushed again");
    }
}
