//! When the next scheduled job falls due, as far as this worker knows: the
//! claim path hints it (a retry's backoff, a rate limit's next admission),
//! the poller sleeps until then. Database timestamps become local deadlines
//! through the clocks' offset the poller measures.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;

/// The next moment a scheduled job falls due, as far as this worker knows,
/// as a local deadline.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    next: Mutex<Option<Instant>>,
    /// The database's clock minus this machine's, in seconds (last poll).
    offset: Mutex<f64>,
    pub(crate) changed: Notify,
}

impl Schedule {
    /// A job becomes due at `at` (a database timestamp): wake the poller
    /// earlier if needed.
    pub(crate) fn hint(&self, at: SystemTime) {
        let due = self.local_deadline(at);
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        if next.is_none_or(|n| due < n) {
            *next = Some(due);
            drop(next);
            self.changed.notify_one();
        }
    }

    /// When `at` (database clock) arrives, as a local deadline.
    fn local_deadline(&self, at: SystemTime) -> Instant {
        let offset = *self.offset.lock().unwrap_or_else(|e| e.into_inner());
        let db_now = secs(SystemTime::now()) + offset;
        let until = (secs(at) - db_now).max(0.0);
        Instant::now() + Duration::from_secs_f64(until.min(1e9))
    }

    pub(crate) fn next_due(&self) -> Option<Instant> {
        *self.next.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replace what the poller learnt from the database, keeping a hint that
    /// arrived meanwhile and is still in the future.
    pub(crate) fn set(&self, due: Option<Instant>) {
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let pending = next.filter(|n| *n > now);
        *next = match (pending, due) {
            (Some(p), Some(a)) => Some(p.min(a)),
            (p, a) => p.or(a),
        };
    }

    pub(crate) fn set_offset(&self, offset: f64) {
        *self.offset.lock().unwrap_or_else(|e| e.into_inner()) = offset;
    }
}

/// Seconds since the Unix epoch (negative before it).
pub(crate) fn secs(t: SystemTime) -> f64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_database_clock_behind_ours_delays_the_deadline_instead_of_spinning() {
        // This machine runs 30 s ahead of the database.
        let s = Schedule::default();
        s.set_offset(-30.0);
        // A retry due in 5 s by the database's clock: 25 s ago by ours.
        let at = SystemTime::now() - Duration::from_secs(25);
        let until = s
            .local_deadline(at)
            .saturating_duration_since(Instant::now());
        assert!(
            until > Duration::from_secs(4) && until <= Duration::from_secs(5),
            "{until:?}"
        );
    }

    #[test]
    fn a_database_clock_ahead_of_ours_brings_the_deadline_forward() {
        let s = Schedule::default();
        s.set_offset(30.0);
        // Due in 5 s by the database's clock: 35 s from now by ours.
        let at = SystemTime::now() + Duration::from_secs(35);
        let until = s
            .local_deadline(at)
            .saturating_duration_since(Instant::now());
        assert!(
            until > Duration::from_secs(4) && until <= Duration::from_secs(5),
            "{until:?}"
        );
    }
}
