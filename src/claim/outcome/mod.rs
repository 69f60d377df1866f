//! The outcome of a run, whatever the delivery mode: the one chooser of
//! its resolution ([`resolve`]), what each resolution writes (here), the results recorded ([`results`]) and the per-minute
//! rollup's counts ([`tally`]).
//!
//! May import [`run`](super::run); never a delivery mode
//! ([`lease`](super::lease), [`tx`](super::tx)), the choice of what to
//! claim, or the claim context.
//!
//! What a finished run writes: the one mapping from a [`Resolution`] to the
//! row it leaves, consumed by both delivery modes (the tx claim's commit,
//! the lease completer). A new outcome kind touches `job.rs` and
//! [`write_of`], nothing else.

pub(crate) mod resolve;
pub(crate) mod results;
pub(crate) mod tally;

use std::time::Duration;

use crate::claim::run::claimed::Claimed;
use crate::handler::Delivery;
use crate::job::{Resolution, CANCELLED_REASON};

/// A run that ended, on its way to its outcome write.
pub(crate) struct Finished {
    pub claimed: Claimed,
    pub resolution: Resolution,
    /// The handler's result (JSON text), kept only while history is on.
    pub result: Option<String>,
    pub duration: Duration,
}

/// The row a finished run leaves.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Write {
    /// Done: the job leaves the queue (with its result, if history is on).
    Done,
    /// Back to `pgwake.jobs`, with these attempts and last error, due after
    /// `delay` (`None`: at once, its place kept).
    Back {
        delay: Option<Duration>,
        attempts: i32,
        last_error: Option<String>,
    },
    /// Snoozed: back to `pgwake.jobs` due after `delay`, with these
    /// attempts (the run's given back) and its last error kept, and the
    /// snooze counted in `pgwake.job_snoozes`, in the same statement.
    Snooze {
        delay: std::time::Duration,
        attempts: i32,
        last_error: Option<String>,
    },
    /// Sleeping: as [`Write::Snooze`], but the sleep is recorded in
    /// `pgwake.job_waits` (migration 0041) instead of counted as a snooze.
    Sleep {
        delay: std::time::Duration,
        attempts: i32,
        last_error: Option<String>,
    },
    /// Waiting for a signal: as [`Write::Sleep`], due at the timeout, the
    /// wait recorded with its key (migration 0042).
    Wait {
        delay: std::time::Duration,
        key: String,
        attempts: i32,
        last_error: Option<String>,
    },
    /// To `pgwake.dead_jobs` with this reason.
    Dead { attempts: i32, reason: String },
    /// Nothing: the job is no longer this worker's to write.
    Nothing,
}

/// What `resolution` of `c`'s run writes, delivered in `delivery`. The one
/// difference between the modes is a lost run: in tx mode the claim still
/// holds the row and hands it back uncharged; a lost lease is someone
/// else's job, and writing anything would undo their run.
pub(crate) fn write_of(c: &Claimed, resolution: &Resolution, delivery: Delivery) -> Write {
    let attempt = c.job.attempt;
    match resolution {
        Resolution::Done => Write::Done,
        Resolution::Retry { reason, delay } => Write::Back {
            delay: Some(*delay),
            attempts: attempt,
            last_error: Some(reason.clone()),
        },
        // A snooze uses no attempt: the claim's is given back.
        Resolution::Snoozed { delay } => Write::Snooze {
            delay: *delay,
            attempts: attempt - 1,
            last_error: c.last_error.clone(),
        },
        // A sleep uses no attempt either.
        Resolution::Sleeping { delay } => Write::Sleep {
            delay: *delay,
            attempts: attempt - 1,
            last_error: c.last_error.clone(),
        },
        // Nor does a wait for a signal.
        Resolution::WaitingForSignal { key, timeout } => Write::Wait {
            delay: *timeout,
            key: key.clone(),
            attempts: attempt - 1,
            last_error: c.last_error.clone(),
        },
        Resolution::Lost if delivery == Delivery::Lease => Write::Nothing,
        // The run does not count (crash charges of a suspect are kept).
        Resolution::Returned | Resolution::Lost => Write::Back {
            delay: None,
            attempts: attempt - 1,
            last_error: c.last_error.clone(),
        },
        // A job found out of attempts before it ran did not run again.
        Resolution::Dead { reason } => Write::Dead {
            attempts: attempt.min(c.job.max_attempts),
            reason: reason.clone(),
        },
        // The run stopped on a cancel request: buried as cancelled (in lease
        // mode fenced by the token: a no-op if the rescuer buried it first).
        Resolution::Cancelled => Write::Dead {
            attempts: attempt.min(c.job.max_attempts),
            reason: CANCELLED_REASON.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(attempt: i32, max_attempts: i32) -> Claimed {
        let mut c = Claimed::for_tests(7);
        c.job.attempt = attempt;
        c.job.max_attempts = max_attempts;
        c.last_error = Some("before".into());
        c
    }

    #[test]
    fn both_modes_write_the_same_but_for_a_lost_run() {
        let c = claimed(3, 5);
        let all = [
            Resolution::Done,
            Resolution::Retry {
                reason: "r".into(),
                delay: Duration::from_secs(2),
            },
            Resolution::Returned,
            Resolution::Snoozed {
                delay: Duration::from_secs(9),
            },
            Resolution::Sleeping {
                delay: Duration::from_secs(60),
            },
            Resolution::WaitingForSignal {
                key: "k".into(),
                timeout: Duration::from_secs(60),
            },
            Resolution::Dead { reason: "d".into() },
            Resolution::Cancelled,
        ];
        for r in &all {
            assert_eq!(
                write_of(&c, r, Delivery::Tx),
                write_of(&c, r, Delivery::Lease),
                "{r:?}"
            );
        }
        assert_eq!(
            write_of(&c, &Resolution::Lost, Delivery::Tx),
            Write::Back {
                delay: None,
                attempts: 2,
                last_error: Some("before".into())
            }
        );
        assert_eq!(
            write_of(&c, &Resolution::Lost, Delivery::Lease),
            Write::Nothing
        );
    }

    #[test]
    fn a_retry_keeps_its_attempt_and_a_returned_run_is_refunded() {
        let c = claimed(3, 5);
        let retry = Resolution::Retry {
            reason: "r".into(),
            delay: Duration::from_secs(2),
        };
        assert_eq!(
            write_of(&c, &retry, Delivery::Tx),
            Write::Back {
                delay: Some(Duration::from_secs(2)),
                attempts: 3,
                last_error: Some("r".into())
            }
        );
        assert_eq!(
            write_of(&c, &Resolution::Returned, Delivery::Tx),
            Write::Back {
                delay: None,
                attempts: 2,
                last_error: Some("before".into())
            }
        );
    }

    #[test]
    fn a_snooze_gives_its_attempt_back_and_keeps_the_last_error() {
        let c = claimed(3, 5);
        let snoozed = Resolution::Snoozed {
            delay: Duration::from_secs(60),
        };
        for delivery in [Delivery::Tx, Delivery::Lease] {
            assert_eq!(
                write_of(&c, &snoozed, delivery),
                Write::Snooze {
                    delay: Duration::from_secs(60),
                    attempts: 2,
                    last_error: Some("before".into())
                }
            );
        }
    }

    #[test]
    fn dead_and_cancelled_never_record_more_attempts_than_allowed() {
        let c = claimed(6, 5);
        assert_eq!(
            write_of(&c, &Resolution::Dead { reason: "d".into() }, Delivery::Tx),
            Write::Dead {
                attempts: 5,
                reason: "d".into()
            }
        );
        assert_eq!(
            write_of(&c, &Resolution::Cancelled, Delivery::Lease),
            Write::Dead {
                attempts: 5,
                reason: CANCELLED_REASON.into()
            }
        );
    }
}
