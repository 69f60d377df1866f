//! The one place that chooses a job's [`Resolution`], in either delivery
//! mode: why a claimed job must not run ([`refusal`]), what a run (or a
//! job that never started) comes to ([`choose`]: a cancel wins, then a lost
//! lease, then what the handler returned, bounded), and what a lease-mode
//! write that its token no longer fenced leaves ([`after_lease_write`]).
//! The modes say what happened; this says what it means.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::claim::run::claimed::Claimed;
use crate::claim::run::executor::Ended;
use crate::config::WorkerConfig;
use crate::handler::Handler;
use crate::job::{sanitize_reason, Job, Outcome, Resolution, SLEEP_MAX, SNOOZE_MAX};

/// Longest delay a handler's `Outcome::Retry { after }` may ask for; longer
/// ones are cut to it (a `run_at` past PostgreSQL's range would make the
/// outcome write fail).
pub(crate) const RETRY_AFTER_MAX: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What stopped a job from outside, as far as its resolution goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Stopped {
    /// Its cancel was requested: it is cancelled, whatever its run
    /// returned (nothing of a tx run is committed yet; a lease run's burial
    /// waits for the run to stop).
    pub cancelled: bool,
    /// lease mode: the lease is lost. A job that never started then ends
    /// `Lost` rather than `Returned`, and so does an interrupted run (an
    /// interruption while the worker is not aborting can only be the
    /// lease's loss).
    pub lease_lost: bool,
}

/// How far a job got.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Run {
    /// It never started (a buffered job handed back, a job cancelled or
    /// its lease lost before it started).
    NotStarted,
    /// Its handler ran and ended so.
    Ended(Ended),
}

/// The resolution of a job that was stopped so and got so far.
pub(crate) fn choose(job: &Job, stopped: Stopped, run: Run, config: &WorkerConfig) -> Resolution {
    if stopped.cancelled {
        return Resolution::Cancelled;
    }
    match run {
        Run::NotStarted if stopped.lease_lost => Resolution::Lost,
        Run::NotStarted => Resolution::Returned,
        Run::Ended(Ended::Interrupted) if stopped.lease_lost => Resolution::Lost,
        Run::Ended(ended) => of_run(job, ended, config),
    }
}

/// What must happen to a claimed job before any handler runs: `None` to
/// run it with `handler` (the registry's handler for its task, if any), or
/// the resolution it gets instead. `stopping`: the worker is shutting down.
pub(crate) fn refusal(
    c: &Claimed,
    stopping: bool,
    handler: Option<&Arc<dyn Handler>>,
) -> Option<Resolution> {
    let job = &c.job;
    if job.attempt > job.max_attempts {
        return Some(Resolution::Dead {
            reason: format!(
                "attempt {} exceeds max_attempts {}: earlier runs never reported an outcome (the worker or its database session crashed while running this job)",
                job.attempt, job.max_attempts
            ),
        });
    }
    if stopping {
        return Some(Resolution::Returned);
    }
    let Some(handler) = handler else {
        return Some(Resolution::Dead {
            reason: format!(
                "no handler for task {:?}: register one (or a `*` catch-all) and retry it with `pgwake dead retry --id {}`",
                job.task, job.id
            ),
        });
    };
    if let Some(why) = &c.undecodable {
        if handler.decodes_payload() {
            return Some(Resolution::Dead {
                reason: why.clone(),
            });
        }
    }
    None
}

/// lease mode: the resolution a run's outcome stands for once its write
/// was tried. `Lost` and `Cancelled` stay (a cancel is recorded as one
/// whoever wrote it: `pgwake.cancel()` or this flush); any other is what
/// was written if its token still fenced the row (`written`), else `Lost`
/// (the lease was rescued meanwhile: the job runs again).
pub(crate) fn after_lease_write(resolution: Resolution, written: bool) -> Resolution {
    match resolution {
        Resolution::Lost => Resolution::Lost,
        Resolution::Cancelled => Resolution::Cancelled,
        r if written => r,
        _ => Resolution::Lost,
    }
}

/// What a finished run means for the job.
fn of_run(job: &Job, ended: Ended, config: &WorkerConfig) -> Resolution {
    match ended {
        Ended::Interrupted => Resolution::Returned,
        Ended::Outcome(Outcome::Done | Outcome::DoneWith(_)) => Resolution::Done,
        Ended::Outcome(Outcome::Fail { reason }) => Resolution::Dead {
            reason: sanitize_reason(&reason),
        },
        Ended::Outcome(Outcome::Snooze(after)) if after <= SNOOZE_MAX => {
            Resolution::Snoozed { delay: after }
        }
        Ended::Outcome(Outcome::Snooze(after)) => of_run(
            job,
            Ended::Outcome(Outcome::retry(format!(
                "the handler asked to snooze for {}, longer than the longest snooze, {} (pgwake::SNOOZE_MAX): snooze less, or enqueue a job with a later run_at",
                humantime::format_duration(Duration::from_secs(after.as_secs())),
                humantime::format_duration(SNOOZE_MAX)
            ))),
            config,
        ),
        Ended::Outcome(Outcome::Sleep(until)) => {
            // A wake time already past wakes it at once.
            let delay = until
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            if delay <= SLEEP_MAX {
                Resolution::Sleeping { delay }
            } else {
                of_run(
                    job,
                    Ended::Outcome(Outcome::retry(format!(
                        "the handler asked to sleep for {}, further ahead than the longest sleep, {} (pgwake::SLEEP_MAX): sleep less, or enqueue a job with a later run_at",
                        humantime::format_duration(Duration::from_secs(delay.as_secs())),
                        humantime::format_duration(SLEEP_MAX)
                    ))),
                    config,
                )
            }
        }
        Ended::Outcome(Outcome::WaitFor { signal, timeout }) => {
            let refused = if timeout > SLEEP_MAX {
                Some(format!(
                    "the handler asked to wait for signal {:?} for {}, longer than the longest wait, {} (pgwake::SLEEP_MAX): wait less, and wait again on the timeout if need be",
                    signal.chars().take(120).collect::<String>(),
                    humantime::format_duration(Duration::from_secs(timeout.as_secs())),
                    humantime::format_duration(SLEEP_MAX)
                ))
            } else {
                crate::job::check_signal_key(&signal)
                    .err()
                    .map(|e| format!("the handler asked to wait for a signal, but {e}"))
            };
            match refused {
                None => Resolution::WaitingForSignal {
                    key: signal,
                    timeout,
                },
                Some(reason) => of_run(job, Ended::Outcome(Outcome::retry(reason)), config),
            }
        }
        Ended::Outcome(Outcome::Retry { reason, after }) => {
            let reason = sanitize_reason(&reason);
            if job.attempt >= job.max_attempts {
                Resolution::Dead {
                    reason: sanitize_reason(&format!(
                        "{reason} (attempt {} of {})",
                        job.attempt, job.max_attempts
                    )),
                }
            } else {
                Resolution::Retry {
                    reason,
                    delay: after
                        .map(|a| a.min(RETRY_AFTER_MAX))
                        .unwrap_or_else(|| config.retry_delay(job.attempt)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chosen(stopped: Stopped, run: Run) -> Resolution {
        let job = Claimed::for_tests(1).job;
        choose(&job, stopped, run, &WorkerConfig::default())
    }

    const CANCELLED: Stopped = Stopped {
        cancelled: true,
        lease_lost: true,
    };
    const LOST: Stopped = Stopped {
        cancelled: false,
        lease_lost: true,
    };

    #[test]
    fn a_cancel_wins_over_everything() {
        for run in [
            Run::NotStarted,
            Run::Ended(Ended::Interrupted),
            Run::Ended(Ended::Outcome(Outcome::Done)),
        ] {
            assert_eq!(chosen(CANCELLED, run), Resolution::Cancelled);
        }
    }

    #[test]
    fn a_lost_lease_loses_only_what_did_not_end_on_its_own() {
        assert_eq!(chosen(LOST, Run::NotStarted), Resolution::Lost);
        assert_eq!(
            chosen(LOST, Run::Ended(Ended::Interrupted)),
            Resolution::Lost
        );
        assert_eq!(
            chosen(LOST, Run::Ended(Ended::Outcome(Outcome::Done))),
            Resolution::Done
        );
        let plain = Stopped::default();
        assert_eq!(chosen(plain, Run::NotStarted), Resolution::Returned);
        assert_eq!(
            chosen(plain, Run::Ended(Ended::Interrupted)),
            Resolution::Returned
        );
    }

    #[test]
    fn a_write_its_token_no_longer_fenced_is_lost() {
        assert_eq!(after_lease_write(Resolution::Done, true), Resolution::Done);
        assert_eq!(after_lease_write(Resolution::Done, false), Resolution::Lost);
        assert_eq!(
            after_lease_write(Resolution::Cancelled, false),
            Resolution::Cancelled
        );
    }
}
