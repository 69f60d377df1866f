//! Progress: what a running job reports of how far it has got (issue 37,
//! item 2). A handler calls [`JobContext::progress`](crate::JobContext::progress)
//! (an `exec` command writes a `pgwake-progress:` stderr line, a persistent
//! handler a `progress` message) with a small JSON value and an optional
//! message; `pgwake job show`, `pgwake explain` and the console show the
//! latest while the job runs.
//!
//! A report costs no round trip: the worker keeps the latest value of each
//! running job in memory and writes those that changed every
//! [`WorkerConfig::progress_interval`](crate::WorkerConfig::progress_interval),
//! one statement for all of them, fenced by each run's claim (a run whose
//! lease was lost or whose claim transaction ended writes nothing, and
//! never over a newer run's value). The value and message are bounded
//! ([`PROGRESS_VALUE_MAX`], [`PROGRESS_DEPTH_MAX`], [`PROGRESS_MESSAGE_MAX`]):
//! a report over a bound is refused with a [`ProgressError`] and changes
//! nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Longest progress value, in bytes of its compact JSON text (4 KiB).
pub const PROGRESS_VALUE_MAX: usize = 4096;

/// Deepest nesting of a progress value's arrays and objects (8): a
/// scalar is 0 deep, `{"done": 4}` 1, `{"files": [{"n": 1}]}` 3.
pub const PROGRESS_DEPTH_MAX: usize = 8;

/// Longest progress message, in characters (200).
pub const PROGRESS_MESSAGE_MAX: usize = 200;

/// Why a progress report was refused; the job goes on, and the last
/// accepted value stays.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgressError {
    /// The value's JSON text is longer than [`PROGRESS_VALUE_MAX`].
    #[error("a progress value of {bytes} bytes of JSON, over the bound of {max} (pgwake::PROGRESS_VALUE_MAX): report a summary, e.g. {{\"done\": 40, \"of\": 100}}")]
    TooLarge {
        /// Its size.
        bytes: usize,
        /// The bound.
        max: usize,
    },
    /// The value is nested deeper than [`PROGRESS_DEPTH_MAX`].
    #[error("a progress value nested {depth} deep, over the bound of {max} (pgwake::PROGRESS_DEPTH_MAX): flatten it")]
    TooDeep {
        /// Its depth.
        depth: usize,
        /// The bound.
        max: usize,
    },
    /// The message is longer than [`PROGRESS_MESSAGE_MAX`].
    #[error("a progress message of {chars} characters, over the bound of {max} (pgwake::PROGRESS_MESSAGE_MAX): shorten it")]
    MessageTooLong {
        /// Its length.
        chars: usize,
        /// The bound.
        max: usize,
    },
    /// The value cannot be written as JSON (a map with keys that are not
    /// strings, a float that is not finite).
    #[error("a progress value that is not JSON: {0}")]
    NotJson(String),
}

/// How deep `v`'s arrays and objects nest (a scalar: 0).
fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// A report checked against the bounds: the value's compact JSON text and
/// the message with control characters replaced.
pub(crate) fn checked(
    value: &serde_json::Value,
    message: Option<&str>,
) -> Result<(String, Option<String>), ProgressError> {
    let d = depth(value);
    if d > PROGRESS_DEPTH_MAX {
        return Err(ProgressError::TooDeep {
            depth: d,
            max: PROGRESS_DEPTH_MAX,
        });
    }
    let text = serde_json::to_string(value).map_err(|e| ProgressError::NotJson(e.to_string()))?;
    if text.len() > PROGRESS_VALUE_MAX {
        return Err(ProgressError::TooLarge {
            bytes: text.len(),
            max: PROGRESS_VALUE_MAX,
        });
    }
    let message = match message {
        None => None,
        Some(m) => {
            let chars = m.chars().count();
            if chars > PROGRESS_MESSAGE_MAX {
                return Err(ProgressError::MessageTooLong {
                    chars,
                    max: PROGRESS_MESSAGE_MAX,
                });
            }
            // Stored as text: a NUL cannot be, and no control character
            // belongs in a one-line message (pages and terminals escape
            // what remains on display).
            Some(
                m.chars()
                    .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
                    .collect(),
            )
        }
    };
    Ok((text, message))
}

/// Which run of a job wrote a progress row: what fences its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Run {
    /// A lease-mode run: its claim token.
    Lease(i64),
    /// A tx-mode run: its claim transaction's id (`xid8`).
    Tx(i64),
}

/// Where a run's reports go: the worker's coalescing writer
/// (`claim::run::progress`), defined here so that this public file does not
/// name the claim path.
pub(crate) trait ProgressSink: Send + Sync {
    /// The latest report of `job`'s run `run` (checked already): replaces
    /// any earlier one not yet written.
    fn report(&self, job: i64, run: Run, value: String, message: Option<String>);
    /// `job`'s run `run`, which reported, has ended: its row goes.
    fn ended(&self, job: i64, run: Run);
}

/// One run's reporter, held by its [`JobContext`](crate::JobContext); when
/// the run ends (the context is dropped) after it reported, its row is
/// cleared.
pub(crate) struct Reporter {
    pub(crate) sink: Arc<dyn ProgressSink>,
    pub(crate) job: i64,
    pub(crate) run: Run,
    reported: AtomicBool,
}

impl Reporter {
    pub(crate) fn new(sink: Arc<dyn ProgressSink>, job: i64, run: Run) -> Reporter {
        Reporter {
            sink,
            job,
            run,
            reported: AtomicBool::new(false),
        }
    }

    /// Check and hand on a report.
    pub(crate) fn report(
        &self,
        value: &serde_json::Value,
        message: Option<&str>,
    ) -> Result<(), ProgressError> {
        let (text, message) = checked(value, message)?;
        self.reported.store(true, Ordering::Release);
        self.sink.report(self.job, self.run, text, message);
        Ok(())
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        if self.reported.load(Ordering::Acquire) {
            self.sink.ended(self.job, self.run);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_and_messages_within_the_bounds_are_taken() {
        let (text, message) =
            checked(&json!({"done": 40, "of": 100}), Some("rows\u{1b}[2J")).unwrap();
        assert_eq!(text, r#"{"done":40,"of":100}"#);
        assert_eq!(message.as_deref(), Some("rows\u{FFFD}[2J"));
        assert!(checked(&json!("x".repeat(PROGRESS_VALUE_MAX - 2)), None).is_ok());
        assert!(checked(&json!(1), Some(&"é".repeat(PROGRESS_MESSAGE_MAX))).is_ok());
    }

    #[test]
    fn values_and_messages_over_the_bounds_are_refused() {
        assert_eq!(
            checked(&json!("x".repeat(PROGRESS_VALUE_MAX - 1)), None),
            Err(ProgressError::TooLarge {
                bytes: PROGRESS_VALUE_MAX + 1,
                max: PROGRESS_VALUE_MAX
            })
        );
        let mut deep = json!(1);
        for _ in 0..=PROGRESS_DEPTH_MAX {
            deep = json!([deep]);
        }
        assert_eq!(
            checked(&deep, None),
            Err(ProgressError::TooDeep {
                depth: PROGRESS_DEPTH_MAX + 1,
                max: PROGRESS_DEPTH_MAX
            })
        );
        assert_eq!(
            checked(&json!(1), Some(&"m".repeat(PROGRESS_MESSAGE_MAX + 1))),
            Err(ProgressError::MessageTooLong {
                chars: PROGRESS_MESSAGE_MAX + 1,
                max: PROGRESS_MESSAGE_MAX
            })
        );
        let e = checked(&json!("x".repeat(5000)), None).unwrap_err();
        assert!(e.to_string().contains("PROGRESS_VALUE_MAX"), "{e}");
    }
}
