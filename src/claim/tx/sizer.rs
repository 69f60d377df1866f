//! Batch size by time: a tx batch grows while it finishes within
//! [`TX_BATCH_TARGET`] and shrinks to fit it.

use std::time::Duration;

/// How long a tx-mode batch should take to run. Batches grow (doubling, up
/// to `--batch`) while they finish faster and shrink to fit it, so a batch
/// pins the vacuum horizon and holds back its later jobs for about this
/// long at most, and slow jobs run one per transaction.
pub const TX_BATCH_TARGET: Duration = Duration::from_millis(100);

/// The largest tx-mode batch while the database is under pressure (the
/// governor's level above ok, as the worker's sampler last read it): a
/// claim transaction holds its rows locked and the vacuum horizon back
/// until it commits, so under pressure the worker keeps its own
/// transactions short and small rather than add to the pressure. Batches
/// are still sized by time below it.
pub const TX_BATCH_UNDER_PRESSURE: usize = 10;

/// How many jobs the next tx-mode claim takes: the sizer's size, capped at
/// [`TX_BATCH_UNDER_PRESSURE`] while `under_pressure`.
pub(crate) fn batch_limit(size: usize, under_pressure: bool) -> usize {
    if under_pressure {
        size.min(TX_BATCH_UNDER_PRESSURE)
    } else {
        size
    }
}

/// Batch size by time (see [`TX_BATCH_TARGET`]); one per claim task.
#[derive(Debug)]
pub(crate) struct BatchSizer {
    size: usize,
    max: usize,
}

impl BatchSizer {
    /// Starts at one job: the first batch of unknown jobs must not be a long
    /// one.
    pub(crate) fn new(max: usize) -> BatchSizer {
        BatchSizer { size: 1, max }
    }

    /// Starts (and may stay) at `max`.
    pub(crate) fn at(max: usize) -> BatchSizer {
        BatchSizer { size: max, max }
    }

    pub(crate) fn size(&self) -> usize {
        self.size
    }

    pub(super) fn observe(&mut self, claimed: usize, ran_for: Duration) {
        if claimed == 0 {
            return;
        }
        if ran_for > TX_BATCH_TARGET {
            let fit = claimed as f64 * TX_BATCH_TARGET.as_secs_f64() / ran_for.as_secs_f64();
            self.size = (fit as usize).clamp(1, self.max);
        } else if claimed >= self.size {
            self.size = (self.size * 2).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_pressure_batches_are_capped() {
        assert_eq!(batch_limit(100, false), 100);
        assert_eq!(batch_limit(100, true), TX_BATCH_UNDER_PRESSURE);
        assert_eq!(batch_limit(3, true), 3);
    }

    #[test]
    fn batches_grow_while_fast_and_shrink_to_the_target() {
        let mut s = BatchSizer::new(100);
        assert_eq!(s.size(), 1);
        for _ in 0..10 {
            let n = s.size();
            s.observe(n, Duration::from_millis(1));
        }
        assert_eq!(s.size(), 100);
        s.observe(100, Duration::from_secs(1));
        assert_eq!(s.size(), 10);
        s.observe(10, Duration::from_secs(7));
        assert_eq!(s.size(), 1);
    }
}
