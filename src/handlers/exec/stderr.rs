//! An `exec` command's stderr: every line in the worker's log, tagged with
//! the job and escaped, within bounds; the `pgwake-retry-after:` line; and
//! the tail kept for `last_error`.

use std::time::Duration;

use crate::job::Job;

/// How much of a failed command's stderr is kept as `last_error`.
pub const STDERR_TAIL_BYTES: usize = 2048;

/// The log target of a command's stderr lines: `RUST_LOG=info,pgwake::exec=warn`
/// keeps them out of the log (but for the notes on lines not logged).
pub const LOG_TARGET: &str = "pgwake::exec";

/// Longest stderr line logged, in bytes as the command wrote them; the rest
/// of a longer line is counted and dropped (`…[cut N bytes]`).
pub const STDERR_LOG_LINE_MAX: usize = 1024;

/// Most stderr lines logged per run of a command; later lines are counted,
/// and their number is logged when the command ends.
pub const STDERR_LOG_LINES_MAX: usize = 256;

/// The reserved stderr line of a command exiting with
/// [`EXIT_RETRY_LATER`](super::EXIT_RETRY_LATER): `pgwake-retry-after: 30s`
/// (a duration such as `90s`, `5m`, `1h 30m`, or a whole number of
/// seconds). The last such line counts.
pub const RETRY_AFTER_LINE: &str = "pgwake-retry-after:";

/// The reserved stderr line of a command exiting with
/// [`EXIT_RETRY_LATER`](super::EXIT_RETRY_LATER) to snooze rather than
/// fail: `pgwake-snooze: 10m` (a delay as for [`RETRY_AFTER_LINE`]). The job
/// comes back after the delay with no attempt used
/// ([`Outcome::Snooze`](crate::Outcome::Snooze)); the last such line
/// counts, and wins over a retry-after line.
pub const SNOOZE_LINE: &str = "pgwake-snooze:";

/// The reserved stderr line of a running command reporting its progress
/// ([`JobContext::progress`](crate::JobContext::progress)): `pgwake-progress:`
/// then a JSON value, then, optionally, a message to the end of the line:
/// `pgwake-progress: {"done": 40, "of": 100} importing rows`. Not logged.
/// A line that is not JSON, or over a bound (the value's
/// [`PROGRESS_VALUE_MAX`](crate::PROGRESS_VALUE_MAX), the message's
/// [`PROGRESS_MESSAGE_MAX`](crate::PROGRESS_MESSAGE_MAX), at most
/// [`PROGRESS_LINE_MAX`] bytes in all), is refused with a warning counted
/// in `pgwake_progress_refused_total`; the command goes on.
pub const PROGRESS_LINE: &str = "pgwake-progress:";

/// Longest `pgwake-progress:` line read, in bytes (8 KiB): a value of
/// 4 KiB and a message of 200 characters fit.
pub const PROGRESS_LINE_MAX: usize = 8192;

/// The reserved stderr line of a running command recording a durable step
/// (as [`JobContext::step`](crate::JobContext::step) records one):
/// `pgwake-step:`, the step's name, a space, then its output as one JSON
/// value to the end of the line: `pgwake-step: charge {"id": "ch_1"}`.
/// Recorded as soon as the line is read, before the command's next line
/// and before the job's outcome. Not logged. A line that is refused (a bad
/// name, not JSON, an output over
/// [`STEP_OUTPUT_MAX`](crate::STEP_OUTPUT_MAX), a line over
/// [`STEP_LINE_MAX`], a name twice in one run or recorded already, the
/// job's [`STEPS_PER_JOB_MAX`](crate::STEPS_PER_JOB_MAX), a lost lease)
/// makes the attempt fail, whatever the exit status, with the refusal as
/// its error (see the book's "Durable steps").
pub const STEP_LINE: &str = "pgwake-step:";

/// Longest `pgwake-step:` line read, in bytes: an output of
/// [`STEP_OUTPUT_MAX`](crate::STEP_OUTPUT_MAX) bytes of compact JSON, the
/// prefix and a name fit, with 1 KiB to spare for spaces.
pub const STEP_LINE_MAX: usize = crate::steps::STEP_OUTPUT_MAX + 1024;

/// The name and output of a `pgwake-step:` line (what follows the prefix):
/// the name up to the first space, then exactly one JSON value. The
/// output's bound is checked when it is recorded.
pub fn parse_step(rest: &str) -> Result<(String, serde_json::Value), String> {
    let rest = rest.trim();
    let (name, json) = rest
        .split_once(|c: char| c.is_ascii_whitespace())
        .unwrap_or((rest, ""));
    crate::steps::check_name(name).map_err(|e| e.to_string())?;
    let json = json.trim();
    if json.is_empty() {
        return Err(format!(
            "{STEP_LINE} line for step {name:?} with no output; expected e.g. `{STEP_LINE} {name} {{\"id\": 1}}` (`null` for none)"
        ));
    }
    let value = serde_json::from_str(json).map_err(|e| {
        format!("{STEP_LINE} line for step {name:?} whose output is not one JSON value ({e}); expected e.g. `{STEP_LINE} {name} {{\"id\": 1}}`")
    })?;
    Ok((name.to_string(), value))
}

/// The value and message of a `pgwake-progress:` line (what follows the
/// prefix): the first JSON value, then the rest of the line as the message.
pub fn parse_progress(rest: &str) -> Result<(serde_json::Value, Option<String>), String> {
    let mut values = serde_json::Deserializer::from_str(rest).into_iter::<serde_json::Value>();
    let value = match values.next() {
        Some(Ok(v)) => v,
        Some(Err(e)) => return Err(format!("{PROGRESS_LINE} line whose value is not JSON ({e}); expected e.g. `{PROGRESS_LINE} {{\"done\": 40, \"of\": 100}} importing rows`")),
        None => return Err(format!("{PROGRESS_LINE} line with no value; expected e.g. `{PROGRESS_LINE} {{\"done\": 40}}`")),
    };
    let message = rest[values.byte_offset()..].trim();
    Ok((value, (!message.is_empty()).then(|| message.to_string())))
}

/// A stderr line as it may reach a log or a terminal: control characters
/// and bidirectional-text controls escaped like `pgwake stats` escapes
/// names (`\u{1b}`), bytes that are not UTF-8 as `\xNN`, everything else as
/// written.
pub fn escape_line(bytes: &[u8]) -> String {
    use crate::admin::stats::is_bidi_control;
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || is_bidi_control(c) {
                out.extend(c.escape_unicode());
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// The delay of a `pgwake-retry-after:` value.
pub fn parse_retry_after(value: &str) -> Result<Duration, String> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value
            .parse::<u64>()
            .map(Duration::from_secs)
            .map_err(|e| format!("{value:?}: {e}"));
    }
    humantime::parse_duration(value).map_err(|e| {
        format!("{value:?} is not a delay ({e}); expected e.g. `{RETRY_AFTER_LINE} 30` (seconds) or `{RETRY_AFTER_LINE} 5m`")
    })
}

/// What a command wrote on stderr, read as it comes: lines go to the log
/// (bounded), the tail is kept, the last retry-after line remembered.
pub(super) struct Stderr {
    /// The job's id and attempt, its task and queue escaped: the tags of
    /// every line logged.
    job: i64,
    attempt: i32,
    task: String,
    queue: String,
    /// The current line, up to [`STDERR_LOG_LINE_MAX`] bytes.
    line: Vec<u8>,
    /// Bytes of the current line past the bound.
    cut: usize,
    logged: usize,
    not_logged: usize,
    /// The value of the last `pgwake-retry-after:` line.
    retry_after: Option<String>,
    /// The value of the last `pgwake-snooze:` line.
    snooze: Option<String>,
    /// `pgwake-progress:` lines not yet reported: what follows the prefix,
    /// or why the line was refused.
    progress: Vec<Result<String, String>>,
    /// `pgwake-step:` lines not yet recorded, the same way.
    steps: Vec<Result<String, String>>,
    tail: Vec<u8>,
    /// [`Stderr::finish`] has run.
    finished: bool,
}

impl Drop for Stderr {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Stderr {
    pub(super) fn new(job: &Job) -> Stderr {
        Stderr {
            job: job.id,
            attempt: job.attempt,
            task: escape_line(job.task.as_bytes()),
            queue: escape_line(job.queue.as_bytes()),
            line: Vec::new(),
            cut: 0,
            logged: 0,
            not_logged: 0,
            retry_after: None,
            snooze: None,
            progress: Vec::new(),
            steps: Vec::new(),
            tail: Vec::new(),
            finished: false,
        }
    }

    /// Take the next bytes the command wrote.
    pub(super) fn push(&mut self, mut bytes: &[u8]) {
        self.tail.extend_from_slice(bytes);
        if self.tail.len() > STDERR_TAIL_BYTES * 2 {
            self.tail.drain(..self.tail.len() - STDERR_TAIL_BYTES);
        }
        while !bytes.is_empty() {
            let (part, ended) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], Some(i + 1)),
                None => (bytes, None),
            };
            let room = PROGRESS_LINE_MAX.saturating_sub(self.line.len());
            let (kept, mut rest) = part.split_at(part.len().min(room));
            self.line.extend_from_slice(kept);
            if !rest.is_empty()
                && self
                    .line
                    .trim_ascii_start()
                    .starts_with(STEP_LINE.as_bytes())
            {
                // A step line holds an output of up to 64 KiB.
                let room = STEP_LINE_MAX.saturating_sub(self.line.len());
                let (more, past) = rest.split_at(rest.len().min(room));
                self.line.extend_from_slice(more);
                rest = past;
            }
            self.cut += rest.len();
            match ended {
                Some(next) => {
                    self.end_line();
                    bytes = &bytes[next..];
                }
                None => break,
            }
        }
    }

    fn end_line(&mut self) {
        let mut line = std::mem::take(&mut self.line);
        let mut cut = std::mem::replace(&mut self.cut, 0);
        if line.trim_ascii_start().starts_with(STEP_LINE.as_bytes()) {
            // Recorded, never logged (its output may be 64 KiB).
            self.steps.push(if cut > 0 {
                Err(format!(
                    "a {STEP_LINE} line of more than {STEP_LINE_MAX} bytes (pgwake::exec::STEP_LINE_MAX; an output is at most pgwake::STEP_OUTPUT_MAX bytes of compact JSON): record a reference (an id, a path), not the data"
                ))
            } else {
                match std::str::from_utf8(&line) {
                    Ok(l) => Ok(l.trim().trim_start_matches(STEP_LINE).to_string()),
                    Err(_) => Err(format!("a {STEP_LINE} line that is not UTF-8")),
                }
            });
            return;
        }
        if line
            .trim_ascii_start()
            .starts_with(PROGRESS_LINE.as_bytes())
        {
            // Reported, never logged (a command may report ten times a second).
            self.progress.push(if cut > 0 {
                Err(format!(
                    "a {PROGRESS_LINE} line of more than {PROGRESS_LINE_MAX} bytes"
                ))
            } else {
                match std::str::from_utf8(&line) {
                    Ok(l) => Ok(l.trim().trim_start_matches(PROGRESS_LINE).to_string()),
                    Err(_) => Err(format!("a {PROGRESS_LINE} line that is not UTF-8")),
                }
            });
            return;
        }
        if line.len() > STDERR_LOG_LINE_MAX {
            cut += line.len() - STDERR_LOG_LINE_MAX;
            line.truncate(STDERR_LOG_LINE_MAX);
        }
        if cut == 0 {
            if let Ok(l) = std::str::from_utf8(&line) {
                if let Some(value) = l.trim().strip_prefix(RETRY_AFTER_LINE) {
                    self.retry_after = Some(value.trim().to_string());
                } else if let Some(value) = l.trim().strip_prefix(SNOOZE_LINE) {
                    self.snooze = Some(value.trim().to_string());
                }
            }
        }
        if self.logged == STDERR_LOG_LINES_MAX {
            self.not_logged += 1;
            return;
        }
        self.logged += 1;
        let mut text = escape_line(&line);
        if cut > 0 {
            text.push_str(&format!("…[cut {cut} bytes]"));
        }
        tracing::info!(
            target: LOG_TARGET,
            job = self.job,
            task = %self.task,
            queue = %self.queue,
            attempt = self.attempt,
            "{text}"
        );
        if self.logged == STDERR_LOG_LINES_MAX {
            tracing::warn!(
                target: LOG_TARGET,
                job = self.job,
                task = %self.task,
                queue = %self.queue,
                attempt = self.attempt,
                "{STDERR_LOG_LINES_MAX} stderr lines logged for this run: later ones are counted, not logged"
            );
        }
    }

    /// The command's stderr is closed, or its run was stopped (timeout,
    /// cancel, shutdown: then on drop): log the last, unterminated line and
    /// how many lines were not logged, once.
    pub(super) fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        if !self.line.is_empty() || self.cut > 0 {
            self.end_line();
        }
        if self.not_logged > 0 {
            tracing::warn!(
                target: LOG_TARGET,
                job = self.job,
                task = %self.task,
                queue = %self.queue,
                attempt = self.attempt,
                "{} more stderr lines not logged (at most {STDERR_LOG_LINES_MAX} per run)",
                self.not_logged
            );
        }
    }

    /// The last [`STDERR_TAIL_BYTES`] of stderr, as text.
    pub(super) fn tail(&self) -> String {
        let start = self.tail.len().saturating_sub(STDERR_TAIL_BYTES);
        String::from_utf8_lossy(&self.tail[start..])
            .trim()
            .to_string()
    }

    /// The value of the last `pgwake-retry-after:` line, if any.
    pub(super) fn retry_after(&self) -> Option<&str> {
        self.retry_after.as_deref()
    }

    /// The `pgwake-progress:` lines read since the last call: what follows
    /// the prefix, or why the line was refused.
    pub(super) fn take_progress(&mut self) -> Vec<Result<String, String>> {
        std::mem::take(&mut self.progress)
    }

    /// The `pgwake-step:` lines read since the last call: what follows the
    /// prefix, or why the line was refused.
    pub(super) fn take_steps(&mut self) -> Vec<Result<String, String>> {
        std::mem::take(&mut self.steps)
    }

    /// The value of the last `pgwake-snooze:` line, if any.
    pub(super) fn snooze(&self) -> Option<&str> {
        self.snooze.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job() -> Job {
        Job {
            id: 7,
            queue: "q".into(),
            task: "t".into(),
            payload: serde_json::Value::Null,
            payload_text: "null".into(),
            priority: 0,
            run_at: std::time::SystemTime::now(),
            attempt: 1,
            max_attempts: 25,
            timeout: None,
            created_at: std::time::SystemTime::now(),
        }
    }

    #[test]
    fn control_bytes_bidi_controls_and_invalid_utf8_are_escaped() {
        assert_eq!(escape_line(b"plain \\ text, \xc3\xa9"), "plain \\ text, é");
        assert_eq!(
            escape_line(b"\x1b[2J\x07\r\t\x7f\xff\xc3"),
            "\\u{1b}[2J\\u{7}\\u{d}\\u{9}\\u{7f}\\xff\\xc3"
        );
        assert_eq!(
            escape_line("a\u{202e}b\u{9b}".as_bytes()),
            "a\\u{202e}b\\u{9b}"
        );
    }

    #[test]
    fn a_retry_after_is_seconds_or_a_duration() {
        assert_eq!(parse_retry_after(" 30 "), Ok(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("0"), Ok(Duration::ZERO));
        assert_eq!(parse_retry_after("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_retry_after("1h 30m"), Ok(Duration::from_secs(5400)));
        for bad in ["", "soon", "-5", "30 parsecs", "99999999999999999999999"] {
            assert!(parse_retry_after(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lines_are_split_across_reads_and_the_last_retry_after_line_counts() {
        let mut s = Stderr::new(&job());
        s.push(b"pgwake-retry-after: 10\nslow down\npgwake-re");
        s.push(b"try-after:  2m\r\nbye");
        s.finish();
        assert_eq!(s.retry_after(), Some("2m"));
        assert_eq!(s.snooze(), None);
        assert_eq!(s.logged, 4);
        assert!(s.tail().ends_with("bye"));
        let mut s = Stderr::new(&job());
        s.push(format!("{SNOOZE_LINE} 1h\nnot yet\n{SNOOZE_LINE}").as_bytes());
        s.push(b" 5\n");
        assert_eq!((s.snooze(), s.retry_after()), (Some("5"), None));
    }

    #[test]
    fn long_lines_and_many_lines_are_bounded() {
        let mut s = Stderr::new(&job());
        s.push(&vec![b'x'; PROGRESS_LINE_MAX * 3]);
        assert_eq!(
            (s.line.len(), s.cut),
            (PROGRESS_LINE_MAX, PROGRESS_LINE_MAX * 2)
        );
        s.push(b"\n");
        assert_eq!((s.line.len(), s.cut, s.logged), (0, 0, 1));
        // A cut line is never a retry-after line.
        s.push(format!("{RETRY_AFTER_LINE} 5{}\n", " ".repeat(STDERR_LOG_LINE_MAX)).as_bytes());
        assert_eq!(s.retry_after(), None);
        s.push("line\n".repeat(STDERR_LOG_LINES_MAX + 10).as_bytes());
        s.finish();
        assert_eq!(s.logged, STDERR_LOG_LINES_MAX);
        assert_eq!(s.not_logged, 12);
        assert!(s.tail.len() <= STDERR_TAIL_BYTES * 2);
    }

    #[test]
    fn step_lines_are_taken_not_logged_and_bounded() {
        let mut s = Stderr::new(&job());
        let big = "x".repeat(crate::STEP_OUTPUT_MAX - 2);
        s.push(
            format!("{STEP_LINE} a {{\"n\": 1}}\nplain\n{STEP_LINE} big \"{big}\"\n").as_bytes(),
        );
        s.push(format!("{STEP_LINE} huge \"{}\"\n", "y".repeat(STEP_LINE_MAX)).as_bytes());
        s.push(b"pgwake-step: odd \"\xff\"\n");
        let got = s.take_steps();
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0].as_deref(), Ok(" a {\"n\": 1}"));
        assert_eq!(
            got[1].as_ref().map(|l| l.len()),
            Ok(crate::STEP_OUTPUT_MAX + 5)
        );
        assert!(
            got[2].as_ref().unwrap_err().contains("STEP_LINE_MAX"),
            "{got:?}"
        );
        assert!(got[3].as_ref().unwrap_err().contains("UTF-8"), "{got:?}");
        assert_eq!(s.logged, 1, "only the plain line is logged");
        assert_eq!(
            parse_step(" charge-card {\"id\": \"ch_1\"} ").unwrap(),
            ("charge-card".to_string(), serde_json::json!({"id": "ch_1"}))
        );
        assert_eq!(parse_step("n null").unwrap().1, serde_json::Value::Null);
        assert!(parse_step("a\u{1b}[2J 1")
            .unwrap_err()
            .contains("STEP_NAME_MAX"));
        assert!(parse_step("a").unwrap_err().contains("no output"));
        assert!(parse_step("a {oops")
            .unwrap_err()
            .contains("not one JSON value"));
        assert!(parse_step("a 1 2")
            .unwrap_err()
            .contains("not one JSON value"));
    }

    #[test]
    fn progress_lines_are_reported_not_logged_and_bounded() {
        let mut s = Stderr::new(&job());
        s.push(format!("{PROGRESS_LINE} {{\"done\": 4}} rows <b>\nplain\n").as_bytes());
        s.push(
            format!(
                "  {PROGRESS_LINE} 7\n{PROGRESS_LINE} {}\n",
                "1".repeat(PROGRESS_LINE_MAX)
            )
            .as_bytes(),
        );
        let got = s.take_progress();
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0].as_deref(), Ok(" {\"done\": 4} rows <b>"));
        assert_eq!(got[1].as_deref(), Ok(" 7"));
        assert!(
            got[2].as_ref().unwrap_err().contains("8192 bytes"),
            "{got:?}"
        );
        assert_eq!(s.logged, 1, "only the plain line is logged");
        assert_eq!(
            parse_progress(" {\"done\": 4} rows <b>").unwrap(),
            (serde_json::json!({"done": 4}), Some("rows <b>".to_string()))
        );
        assert_eq!(parse_progress("7").unwrap(), (serde_json::json!(7), None));
        assert!(parse_progress(" {oops").unwrap_err().contains("not JSON"));
        assert!(parse_progress("  ").unwrap_err().contains("no value"));
    }
}
