//! A claimed job, and the typed outcome a handler returns for it.

use std::time::{Duration, SystemTime};

/// A job as a handler sees it.
#[derive(Debug, Clone)]
pub struct Job {
    /// The job's id (stable across retries; kept in `dead_jobs`).
    pub id: i64,
    /// The queue it was enqueued on.
    pub queue: String,
    /// The task name that selects its handler.
    pub task: String,
    /// The payload, as enqueued.
    pub payload: serde_json::Value,
    /// Lower runs first.
    pub priority: i32,
    /// When it became (or becomes) due.
    pub run_at: SystemTime,
    /// This run's attempt number, starting at 1. Counts runs that crashed
    /// their worker, too.
    pub attempt: i32,
    /// After this many attempts a failing job moves to `pgwake.dead_jobs`.
    pub max_attempts: i32,
    /// When it was enqueued.
    pub created_at: SystemTime,
}

/// What a handler decided about a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The job is done: it leaves the queue (in `tx` mode, atomically with
    /// whatever the handler wrote through the claim transaction).
    Done,
    /// Try again later. `after` overrides the exponential backoff. Counts as
    /// a failed attempt: at `max_attempts` the job moves to `dead_jobs`.
    Retry {
        /// Why this attempt failed; stored as `last_error`.
        reason: String,
        /// Delay before the next attempt; `None` for the configured backoff.
        after: Option<Duration>,
    },
    /// Give up now, whatever attempts remain: the job moves to `dead_jobs`.
    Fail {
        /// Why; stored as `last_error`.
        reason: String,
    },
}

impl Outcome {
    /// A failed attempt with the configured backoff.
    pub fn retry(reason: impl Into<String>) -> Outcome {
        Outcome::Retry {
            reason: reason.into(),
            after: None,
        }
    }

    /// A failed attempt, retried after `after`.
    pub fn retry_after(reason: impl Into<String>, after: Duration) -> Outcome {
        Outcome::Retry {
            reason: reason.into(),
            after: Some(after),
        }
    }

    /// A permanent failure.
    pub fn fail(reason: impl Into<String>) -> Outcome {
        Outcome::Fail {
            reason: reason.into(),
        }
    }
}

/// The label an outcome carries in metrics and logs once it is resolved
/// against the job's remaining attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Completed and removed.
    Done,
    /// Put back with a backoff.
    Retry,
    /// Moved to `dead_jobs`.
    Dead,
    /// Not run to an end (shutdown): put back without using an attempt.
    Returned,
}

impl Resolution {
    /// The `outcome` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Done => "done",
            Resolution::Retry => "retry",
            Resolution::Dead => "dead",
            Resolution::Returned => "returned",
        }
    }
}
