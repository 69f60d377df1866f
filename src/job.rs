//! A claimed job, the typed outcome a handler returns for it, and what that
//! outcome makes of the job ([`Resolution`]).

use std::time::{Duration, SystemTime};

/// A job as a handler sees it.
#[non_exhaustive]
#[derive(Debug, Clone)]
pub struct Job {
    /// The job's id (stable across retries; kept in `dead_jobs`).
    pub id: i64,
    /// The queue it was enqueued on.
    pub queue: String,
    /// The task name that selects its handler.
    pub task: String,
    /// The payload, decoded. Numbers keep their exact digits
    /// (`12345678901234567890123` stays that, `1e400` stays `1e400`): pgwake
    /// decodes with serde_json's arbitrary precision. `Null` when the stored
    /// payload cannot be decoded (nested deeper than
    /// [`PAYLOAD_DEPTH_LIMIT`] levels); such a job only reaches handlers
    /// that read [`Job::payload_text`] (see [`crate::Handler::decodes_payload`]).
    pub payload: serde_json::Value,
    /// The payload exactly as PostgreSQL stores it (`payload::text`). `exec`
    /// writes this to stdin and `sql` binds it, untouched.
    pub payload_text: String,
    /// Lower runs first.
    pub priority: i32,
    /// When it became (or becomes) due.
    pub run_at: SystemTime,
    /// This run's attempt number, starting at 1. Counts runs that crashed
    /// their worker, too.
    pub attempt: i32,
    /// After this many attempts a failing job moves to `pgwake.dead_jobs`.
    pub max_attempts: i32,
    /// The job's own timeout (the `timeout` column), if it has one; else the
    /// worker's `job_timeout` applies.
    pub timeout: Option<Duration>,
    /// When it was enqueued.
    pub created_at: SystemTime,
}

/// Most levels of nesting a payload may have to be decoded into
/// [`Job::payload`] (serde_json's recursion limit). Deeper payloads are kept
/// and passed intact as text.
pub const PAYLOAD_DEPTH_LIMIT: usize = 128;

/// Decode a stored payload exactly; `Err` says why it cannot be.
pub(crate) fn decode_payload(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| {
        format!(
            "payload cannot be decoded ({e}); payloads nested deeper than {PAYLOAD_DEPTH_LIMIT} levels reach only handlers that take the payload as text (exec, sql)"
        )
    })
}

/// What a handler decided about a job.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The job is done: it leaves the queue (in `tx` mode, atomically with
    /// whatever the handler wrote through the claim transaction).
    Done,
    /// The job is done, with a result: like [`Outcome::Done`], and when
    /// history is on (`pgwake run --keep-finished`) the value is stored in
    /// `pgwake.finished_jobs.result`, in the same transaction (tx mode) or
    /// statement (lease mode) that completes the job. `Null` means no
    /// result. Build it with [`Outcome::done_with`].
    DoneWith(serde_json::Value),
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
    /// Put the job back for this long without using an attempt and without
    /// counting as a failure ("not yet": the thing it waits for is not
    /// ready). Its `last_error` is kept; the snooze is counted
    /// (`pgwake.job_snoozes`, shown by `pgwake explain`). At most
    /// [`SNOOZE_MAX`]: a longer snooze is refused, and the run counts as a
    /// failed attempt whose error says so. Build it with [`Outcome::snooze`].
    Snooze(Duration),
    /// Sleep until this time without using an attempt and without counting
    /// as a failure (a step of the job's work is due later: a reminder, a
    /// follow-up). The job leaves the claim path until then and holds no
    /// slot; its `last_error` is kept; the sleep is recorded
    /// (`pgwake.job_waits`, shown by `pgwake explain` as "sleeping until
    /// …"). A time in the past wakes it at once. At most [`SLEEP_MAX`]
    /// ahead: a longer sleep is refused, and the run counts as a failed
    /// attempt whose error says so. Build it with [`Outcome::sleep_until`].
    Sleep(SystemTime),
    /// Wait for a signal: end this run without using an attempt and
    /// without counting as a failure, and run the job again when a signal
    /// for the key `signal` arrives (`pgwake.signal(key, payload)` in SQL,
    /// `pgwake signal KEY`, [`crate::client::signal`]) or when `timeout`
    /// has passed, whichever comes first. Until then the job is out of the
    /// claim path and holds no slot; its recorded steps are kept. On the
    /// next run, [`JobContext::signal`](crate::JobContext::signal) says
    /// which: [`Signal::Received`] with the payload or [`Signal::TimedOut`].
    /// A signal sent before the wait began and kept (24 hours by default)
    /// resumes it at once. A wait always has a timeout (there is no
    /// unbounded wait), at most [`SLEEP_MAX`]; a longer one, or a key that
    /// is empty, over [`crate::config::KEY_MAX`] bytes or holds a control
    /// character, is refused: the run counts as a failed attempt whose
    /// error names the bound. Build it with [`Outcome::wait_for`].
    WaitFor {
        /// The key a signal must name (e.g. `"payment:42"`).
        signal: String,
        /// How long to wait at most.
        timeout: Duration,
    },
}

impl Outcome {
    /// Done, with a result for the history (see [`Outcome::DoneWith`]).
    pub fn done_with(result: impl Into<serde_json::Value>) -> Outcome {
        Outcome::DoneWith(result.into())
    }

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

    /// Not yet: run the job again after `after`, with no attempt used (see
    /// [`Outcome::Snooze`]).
    pub fn snooze(after: Duration) -> Outcome {
        Outcome::Snooze(after)
    }

    /// Wake at `until`, with no attempt used (see [`Outcome::Sleep`]).
    pub fn sleep_until(until: SystemTime) -> Outcome {
        Outcome::Sleep(until)
    }

    /// Wait for a signal named `key`, at most `timeout` (see
    /// [`Outcome::WaitFor`]).
    pub fn wait_for(key: impl Into<String>, timeout: Duration) -> Outcome {
        Outcome::WaitFor {
            signal: key.into(),
            timeout,
        }
    }
}

/// How a job's last wait for a signal ([`Outcome::WaitFor`]) ended, read
/// on a later run with [`JobContext::signal`](crate::JobContext::signal).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// A signal for the key arrived, with its payload (`Null` when it was
    /// sent without one).
    Received(serde_json::Value),
    /// No signal came: the job runs because its timeout passed (or because
    /// something else made it due, such as `pgwake queue` actions).
    TimedOut,
}

/// Check a signal key as the database would ([`Outcome::WaitFor`],
/// [`crate::client::signal`]): 1 to [`crate::config::KEY_MAX`] bytes, no
/// control characters. The error names the bound.
pub(crate) fn check_signal_key(key: &str) -> Result<(), String> {
    if key.is_empty() {
        return Err(
            "the signal key is empty: name what the job waits for, e.g. \"payment:42\"".into(),
        );
    }
    if key.len() > crate::config::KEY_MAX {
        return Err(format!(
            "the signal key is {} bytes, over the bound of {} (pgwake::config::KEY_MAX): use a short key (an id, a hash of a longer name)",
            key.len(),
            crate::config::KEY_MAX
        ));
    }
    if key.chars().any(char::is_control) {
        return Err("the signal key has a control character: use printable characters only (e.g. \"payment:42\")".into());
    }
    Ok(())
}

/// Largest signal payload, in bytes of its JSON text (64 KiB).
pub const SIGNAL_PAYLOAD_MAX: usize = 64 * 1024;

/// Furthest ahead a handler may sleep its job (365 days from the end of the
/// run). A longer sleep (a sleep of 100 years, a timestamp in the wrong
/// unit) is refused: the run counts as a failed attempt (retried with the
/// backoff, or dead when it was the last) whose error names this bound. A
/// job to run that far ahead is enqueued with its `run_at`.
pub const SLEEP_MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// Longest snooze a handler may ask for (30 days). A longer one is refused:
/// the run counts as a failed attempt (retried with the backoff, or dead
/// when it was the last) whose error names this bound, so a handler that
/// computes a wrong delay (a timestamp taken for a duration: 56 years) is
/// seen at once rather than parked out of sight. A job to run that far
/// ahead is enqueued with its `run_at`.
pub const SNOOZE_MAX: Duration = Duration::from_secs(30 * 24 * 3600);

/// How many snoozes of one job `pgwake explain` takes for normal; past
/// this it warns that the job may be snoozing forever. Snoozes are not
/// bounded in number (each is a decision of the handler, which may wait
/// for something slow), but never unnoticed: counted per job, shown by
/// `pgwake explain`, `pgwake job show`, `pgwake stats` and the
/// `pgwake_jobs_total{outcome="snoozed"}` counter.
pub const SNOOZES_WARN: i32 = 100;

/// The `last_error` of a cancelled job in `pgwake.dead_jobs` (the same text
/// `pgwake.cancel()` writes for a waiting job).
pub(crate) const CANCELLED_REASON: &str = "cancelled";

/// What becomes of a job once its run has ended: the handler's [`Outcome`]
/// resolved against the job's remaining attempts, or the run not counted at
/// all. This is what is written to the database and reported.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// Completed and removed.
    Done,
    /// Put back, due again after `delay`, with this attempt counted.
    Retry {
        /// `last_error`.
        reason: String,
        /// Backoff before the next attempt.
        delay: Duration,
    },
    /// Moved to `dead_jobs`.
    Dead {
        /// `last_error`.
        reason: String,
    },
    /// Snoozed ([`Outcome::Snooze`]): put back, due again after `delay`,
    /// with this attempt given back and the snooze counted.
    Snoozed {
        /// How long it sleeps.
        delay: Duration,
    },
    /// Sleeping ([`Outcome::Sleep`]): put back, due again after `delay`
    /// (its wake time less the end of the run), with this attempt given
    /// back and the sleep recorded.
    Sleeping {
        /// How long it sleeps.
        delay: Duration,
    },
    /// Waiting for a signal ([`Outcome::WaitFor`]): put back, due again
    /// after `timeout` unless a signal for `key` comes first, with this
    /// attempt given back and the wait recorded.
    WaitingForSignal {
        /// The key.
        key: String,
        /// How long it waits at most.
        timeout: Duration,
    },
    /// Not run to an end (shutdown, or the worker lost its claim connection
    /// before the handler started): put back without using an attempt.
    Returned,
    /// lease mode: the lease was lost (expired and rescued, or could not be
    /// renewed) while the handler ran; the job belongs to someone else now
    /// and nothing is written.
    Lost,
    /// Stopped by `pgwake cancel` (or `pgwake.cancel()`) while it ran: in
    /// `tx` mode its work is rolled back, in both modes it is in `dead_jobs`
    /// with `last_error = 'cancelled'`.
    Cancelled,
}

impl Resolution {
    /// The `outcome` label value.
    pub fn label(&self) -> &'static str {
        match self {
            Resolution::Done => "done",
            Resolution::Retry { .. } => "retry",
            Resolution::Dead { .. } => "dead",
            Resolution::Snoozed { .. } => "snoozed",
            Resolution::Sleeping { .. } => "sleeping",
            Resolution::WaitingForSignal { .. } => "waiting_for_signal",
            Resolution::Returned => "returned",
            Resolution::Lost => "lost",
            Resolution::Cancelled => "cancelled",
        }
    }

    /// The failure reason, for retries and dead jobs.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Resolution::Retry { reason, .. } | Resolution::Dead { reason } => Some(reason),
            _ => None,
        }
    }
}

/// Longest `last_error` kept, in bytes; longer reasons keep their end (where
/// a stderr tail has the actual error) behind a marker.
pub(crate) const LAST_ERROR_MAX_BYTES: usize = 4096;

/// A failure reason that the database can always store: no NUL (PostgreSQL
/// text cannot hold one), other control characters except tab and newline
/// replaced, at most [`LAST_ERROR_MAX_BYTES`] bytes cut at a character
/// boundary. An outcome write must never fail because of what a handler
/// printed: that would take the job's batch with it.
pub(crate) fn sanitize_reason(reason: &str) -> String {
    let cleaned: String = reason
        .chars()
        .map(|c| match c {
            '\0' => '\u{FFFD}',
            '\t' | '\n' => c,
            c if c.is_control() => '\u{FFFD}',
            c => c,
        })
        .collect();
    if cleaned.len() <= LAST_ERROR_MAX_BYTES {
        return cleaned;
    }
    const MARK: &str = "…[cut] ";
    let mut start = cleaned.len() - (LAST_ERROR_MAX_BYTES - MARK.len());
    while !cleaned.is_char_boundary(start) {
        start += 1;
    }
    format!("{MARK}{}", &cleaned[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_lose_nul_and_keep_their_tail() {
        assert_eq!(
            sanitize_reason("a\0b\tc\nd\x07"),
            "a\u{FFFD}b\tc\nd\u{FFFD}"
        );
        let long = format!("{}END", "é".repeat(5000));
        let s = sanitize_reason(&long);
        assert!(s.len() <= LAST_ERROR_MAX_BYTES, "{}", s.len());
        assert!(s.ends_with("END") && s.starts_with("…[cut]"));
    }

    #[test]
    fn payload_numbers_stay_exact() {
        for (text, exact) in [
            (
                r#"{"n": 12345678901234567890123}"#,
                "12345678901234567890123",
            ),
            (r#"{"n": 0.10000000000000000001}"#, "0.10000000000000000001"),
            (r#"{"n": 1e400}"#, "1e+400"),
        ] {
            let v = decode_payload(text).unwrap();
            assert_eq!(v["n"].to_string(), exact);
        }
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        assert!(decode_payload(&deep).is_err());
    }
}
