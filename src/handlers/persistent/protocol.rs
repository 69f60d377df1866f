//! The line protocol between pgwake and a persistent handler process
//! (docs/src/protocol.md): one JSON object per line, `"type"` naming the
//! message. pgwake writes on the process's fd 3 and reads its fd 4.
//!
//! Public so that the conformance check ([`super::check`]) and other tools
//! build and read lines exactly as the pool does: [`parse`] a process's
//! line, [`job`], [`cancel`], [`ping`] and [`drain`] lines to send, and
//! [`read_line`] with the line limit.

use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The protocol version this pgwake speaks.
pub const PROTOCOL_VERSION: u64 = 1;

/// The descriptor a process reads pgwake's messages from.
pub const PROCESS_IN_FD: i32 = 3;

/// The descriptor a process writes its messages to.
pub const PROCESS_OUT_FD: i32 = 4;

/// Default longest line a process may write (`--protocol-line-max`).
pub const LINE_MAX_DEFAULT: usize = 16 * 1024 * 1024;

/// Most jobs a process may ask to hold at once (its hello's `inflight`).
pub const INFLIGHT_MAX: u64 = 1024;

/// Longest task name list a hello may carry.
pub const HELLO_TASKS_MAX: usize = 10_000;

/// Most seconds a `snooze` message's `after` may say (ten years, as a
/// fail's `retry_after`); more is a protocol error. Snoozes past
/// [`crate::SNOOZE_MAX`] (30 days) are read, and refused as a failed
/// attempt whose error names the bound.
pub const SNOOZE_AFTER_MAX: f64 = 10.0 * 365.0 * 86_400.0;

/// A message a process sent.
#[derive(Debug)]
pub enum Incoming {
    /// The handshake.
    Hello {
        /// The version it speaks.
        version: u64,
        /// The tasks it serves (`*`: any).
        tasks: Vec<String>,
        /// Jobs it takes at once.
        inflight: usize,
        /// What its job messages carry besides the job ([`WANTS_STEPS`],
        /// [`WANTS_PARENT_RESULTS`]): the hello's optional `"steps": true`
        /// and `"parent_results": true`.
        wants: u8,
    },
    /// A job succeeded.
    Done {
        /// The job.
        id: i64,
        /// The token of its job message.
        token: String,
        /// Its result (`None`: no result).
        result: Option<serde_json::Value>,
    },
    /// A job's attempt failed.
    Fail {
        /// The job.
        id: i64,
        /// The token of its job message.
        token: String,
        /// Why.
        error: String,
        /// Dead now, whatever attempts remain.
        for_good: bool,
        /// Retry after this many seconds instead of the backoff.
        retry_after: Option<f64>,
    },
    /// Not yet: the job goes back for `after` seconds, no attempt used
    /// ([`crate::Outcome::Snooze`]).
    Snooze {
        /// The job.
        id: i64,
        /// The token of its job message.
        token: String,
        /// Seconds until it runs again (0 to [`SNOOZE_AFTER_MAX`]; past
        /// [`crate::SNOOZE_MAX`] the run is a failed attempt that says so).
        after: f64,
    },
    /// How far the job has got ([`crate::JobContext::progress`]): not an
    /// answer, the job goes on. A value or message over its bound is
    /// refused with a counted warning, not a protocol error.
    Progress {
        /// The job.
        id: i64,
        /// The token of its job message.
        token: String,
        /// A small JSON value (at most [`crate::PROGRESS_VALUE_MAX`] bytes).
        value: serde_json::Value,
        /// An optional message (at most [`crate::PROGRESS_MESSAGE_MAX`]
        /// characters).
        message: Option<String>,
    },
    /// A durable step the job ran, to record as
    /// [`crate::JobContext::step`] does; answered with a `step_recorded`
    /// message. Not an answer: the job goes on.
    Step {
        /// The job.
        id: i64,
        /// The token of its job message.
        token: String,
        /// The step's name (checked when it is recorded).
        name: String,
        /// Its output (`null` when absent).
        output: serde_json::Value,
    },
    /// An answer to a ping.
    Pong {
        /// The ping's `seq` (absent: a process that does not echo it).
        seq: Option<u64>,
    },
    /// A statement to run in a tx-mode job's claim transaction.
    Sql {
        /// The job.
        id: i64,
        /// The token of its job message.
        token: String,
        /// Echoed back in the `sql_result`.
        seq: u64,
        /// The statement.
        sql: String,
        /// Its parameters.
        params: Vec<serde_json::Value>,
    },
}

impl Incoming {
    /// The job a reply is about, with its token.
    pub fn job(&self) -> Option<(i64, &str)> {
        match self {
            Incoming::Done { id, token, .. }
            | Incoming::Fail { id, token, .. }
            | Incoming::Snooze { id, token, .. }
            | Incoming::Progress { id, token, .. }
            | Incoming::Step { id, token, .. }
            | Incoming::Sql { id, token, .. } => Some((*id, token)),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct Raw {
    #[serde(rename = "type")]
    kind: String,
    version: Option<u64>,
    tasks: Option<Vec<String>>,
    inflight: Option<u64>,
    id: Option<i64>,
    token: Option<String>,
    result: Option<serde_json::Value>,
    error: Option<serde_json::Value>,
    for_good: Option<bool>,
    retry_after: Option<f64>,
    after: Option<f64>,
    value: Option<serde_json::Value>,
    message: Option<String>,
    seq: Option<u64>,
    sql: Option<String>,
    params: Option<Vec<serde_json::Value>>,
    steps: Option<bool>,
    parent_results: Option<bool>,
    name: Option<String>,
    output: Option<serde_json::Value>,
}

/// A hello's `"steps": true`: its job messages carry the job's recorded
/// steps.
pub const WANTS_STEPS: u8 = 1;

/// A hello's `"parent_results": true`: its job messages carry the job's
/// parents' results.
pub const WANTS_PARENT_RESULTS: u8 = 2;

/// Parse one line a process wrote. `Err` says what is wrong with it, for
/// the log and the process's replacement.
pub fn parse(line: &[u8]) -> Result<Incoming, String> {
    let raw: Raw = serde_json::from_slice(line).map_err(|e| {
        format!(
            "not a JSON protocol message ({e}): {}",
            crate::handlers::exec::escape_line(&line[..line.len().min(200)])
        )
    })?;
    let need = |field: &str| format!("a {:?} message without {field:?}", raw.kind);
    let job = |raw: &Raw| -> Result<(i64, String), String> {
        Ok((
            raw.id.ok_or_else(|| need("id"))?,
            raw.token.clone().ok_or_else(|| need("token"))?,
        ))
    };
    Ok(match raw.kind.as_str() {
        "hello" => {
            let version = raw.version.ok_or_else(|| need("version"))?;
            let tasks = raw.tasks.clone().ok_or_else(|| need("tasks"))?;
            if tasks.len() > HELLO_TASKS_MAX {
                return Err(format!(
                    "a hello with {} tasks (at most {HELLO_TASKS_MAX})",
                    tasks.len()
                ));
            }
            let inflight = raw.inflight.unwrap_or(1);
            if !(1..=INFLIGHT_MAX).contains(&inflight) {
                return Err(format!(
                    "a hello with inflight {inflight}: it must be 1 to {INFLIGHT_MAX}"
                ));
            }
            let wants = if raw.steps == Some(true) {
                WANTS_STEPS
            } else {
                0
            } | if raw.parent_results == Some(true) {
                WANTS_PARENT_RESULTS
            } else {
                0
            };
            Incoming::Hello {
                version,
                tasks,
                inflight: inflight as usize,
                wants,
            }
        }
        "done" => {
            let (id, token) = job(&raw)?;
            Incoming::Done {
                id,
                token,
                result: raw.result,
            }
        }
        "fail" => {
            let (id, token) = job(&raw)?;
            if let Some(after) = raw.retry_after {
                if !(0.0..=10.0 * 365.0 * 86_400.0).contains(&after) {
                    return Err(format!(
                        "a fail message with retry_after {after}: seconds from 0 to ten years"
                    ));
                }
            }
            let error = match raw.error {
                Some(serde_json::Value::String(s)) => s,
                Some(other) => other.to_string(),
                None => "the handler failed (no error given)".into(),
            };
            Incoming::Fail {
                id,
                token,
                error,
                for_good: raw.for_good.unwrap_or(false),
                retry_after: raw.retry_after,
            }
        }
        "snooze" => {
            let (id, token) = job(&raw)?;
            let after = raw.after.ok_or_else(|| need("after"))?;
            if !(0.0..=SNOOZE_AFTER_MAX).contains(&after) {
                return Err(format!(
                    "a snooze message with after {after}: seconds from 0 to ten years (a snooze past 30 days is a failed attempt)"
                ));
            }
            Incoming::Snooze { id, token, after }
        }
        "progress" => {
            let (id, token) = job(&raw)?;
            let value = raw.value.ok_or_else(|| need("value"))?;
            Incoming::Progress {
                id,
                token,
                value,
                message: raw.message,
            }
        }
        "step" => {
            let (id, token) = job(&raw)?;
            Incoming::Step {
                id,
                token,
                name: raw.name.ok_or_else(|| need("name"))?,
                output: raw.output.unwrap_or_default(),
            }
        }
        "pong" => Incoming::Pong { seq: raw.seq },
        "sql" => {
            let (id, token) = job(&raw)?;
            Incoming::Sql {
                id,
                token,
                seq: raw.seq.ok_or_else(|| need("seq"))?,
                sql: raw.sql.ok_or_else(|| need("sql"))?,
                params: raw.params.unwrap_or_default(),
            }
        }
        other => {
            return Err(format!(
                "unknown message type {:?}",
                crate::handlers::exec::escape_line(&other.as_bytes()[..other.len().min(100)])
            ))
        }
    })
}

/// A JSON string literal of `s`.
fn quote(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

/// The `welcome` line answering a hello.
pub fn welcome(process: usize, ping_interval_ms: u128) -> String {
    format!(
        "{{\"type\":\"welcome\",\"version\":{PROTOCOL_VERSION},\"process\":{process},\"ping_interval_ms\":{ping_interval_ms}}}\n"
    )
}

/// What a `job` line carries.
pub struct JobLine<'a> {
    /// The job.
    pub id: i64,
    /// This dispatch's token.
    pub token: &'a str,
    /// Its task.
    pub task: &'a str,
    /// Its queue.
    pub queue: &'a str,
    /// Its payload as stored.
    pub payload: &'a str,
    /// This run's attempt.
    pub attempt: i32,
    /// Its attempts in all.
    pub max_attempts: i32,
    /// When it times out.
    pub deadline: chrono::DateTime<chrono::Utc>,
    /// Whether it runs in tx mode.
    pub tx: bool,
    /// Its ordering, unique and limit keys.
    pub keys: [Option<&'a str>; 3],
    /// The run's W3C trace context, when the worker traces jobs: sent as
    /// `"traceparent"` (and `"tracestate"`); absent otherwise.
    pub trace: Option<&'a crate::trace::TraceContext>,
    /// The job's recorded steps, a JSON object by name (PostgreSQL's jsonb
    /// text: one line), sent as `"steps"`; absent when `None`.
    pub steps: Option<&'a str>,
    /// Its parents' results, `pgwake.parent_results`'s object, sent as
    /// `"parent_results"`; absent when `None`.
    pub parent_results: Option<&'a str>,
}

/// The `job` line: the payload goes in exactly as stored (a JSON value
/// already; numbers keep their digits).
pub fn job(j: &JobLine<'_>) -> String {
    // The stored text is JSON; PostgreSQL's jsonb text never holds a raw
    // newline (it escapes them in strings), but a `json`-typed column
    // could, so normalise through RawValue when one is there.
    let payload: std::borrow::Cow<'_, str> = if j.payload.contains('\n') {
        match serde_json::from_str::<&RawValue>(j.payload) {
            Ok(_) => j.payload.replace(['\n', '\r'], " ").into(),
            Err(_) => quote(j.payload).into(),
        }
    } else {
        j.payload.into()
    };
    // Only a traced run's line names its context.
    let trace = match j.trace {
        None => String::new(),
        Some(t) => match &t.tracestate {
            None => format!(",\"traceparent\":{}", quote(&t.traceparent)),
            Some(s) => format!(
                ",\"traceparent\":{},\"tracestate\":{}",
                quote(&t.traceparent),
                quote(s)
            ),
        },
    };
    // jsonb text, one line; only for a process that asked (its hello).
    let mut inputs = String::new();
    if let Some(steps) = j.steps {
        inputs.push_str(",\"steps\":");
        inputs.push_str(steps);
    }
    if let Some(parents) = j.parent_results {
        inputs.push_str(",\"parent_results\":");
        inputs.push_str(parents);
    }
    format!(
        "{{\"type\":\"job\",\"id\":{},\"token\":{},\"task\":{},\"queue\":{},\"payload\":{},\"attempt\":{},\"max_attempts\":{},\"deadline\":{},\"tx\":{},\"keys\":{{\"ordering\":{},\"unique\":{},\"limit\":{}}}{}{}}}\n",
        j.id,
        quote(j.token),
        quote(j.task),
        quote(j.queue),
        payload,
        j.attempt,
        j.max_attempts,
        quote(&j.deadline.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        j.tx,
        key(j.keys[0]),
        key(j.keys[1]),
        key(j.keys[2]),
        trace,
        inputs,
    )
}

/// The `step_recorded` line answering a `step` message: `error` when it
/// was refused (its name cut to 120 characters).
pub fn step_recorded(id: i64, token: &str, name: &str, error: Option<&str>) -> String {
    let name: String = name.chars().take(120).collect();
    match error {
        None => format!(
            "{{\"type\":\"step_recorded\",\"id\":{id},\"token\":{},\"name\":{}}}\n",
            quote(token),
            quote(&name)
        ),
        Some(e) => format!(
            "{{\"type\":\"step_recorded\",\"id\":{id},\"token\":{},\"name\":{},\"error\":{}}}\n",
            quote(token),
            quote(&name),
            quote(e)
        ),
    }
}

/// A key as JSON: a string, or `null`.
fn key(k: Option<&str>) -> String {
    k.map(quote).unwrap_or_else(|| "null".into())
}

/// The `cancel` line.
pub fn cancel(id: i64, token: &str, reason: &str) -> String {
    format!(
        "{{\"type\":\"cancel\",\"id\":{id},\"token\":{},\"reason\":{}}}\n",
        quote(token),
        quote(reason)
    )
}

/// The `ping` line.
pub fn ping(seq: u64) -> String {
    format!("{{\"type\":\"ping\",\"seq\":{seq}}}\n")
}

/// The `drain` line.
pub fn drain() -> String {
    "{\"type\":\"drain\"}\n".into()
}

/// An `sql_result` line with rows.
pub fn sql_rows(
    id: i64,
    token: &str,
    seq: u64,
    rows: &[serde_json::Value],
    affected: u64,
) -> String {
    format!(
        "{{\"type\":\"sql_result\",\"id\":{id},\"token\":{},\"seq\":{seq},\"rows\":{},\"rows_affected\":{affected}}}\n",
        quote(token),
        serde_json::Value::Array(rows.to_vec())
    )
}

/// An `sql_result` line with an error.
pub fn sql_error(id: i64, token: &str, seq: u64, message: &str, code: Option<&str>) -> String {
    format!(
        "{{\"type\":\"sql_result\",\"id\":{id},\"token\":{},\"seq\":{seq},\"error\":{{\"message\":{},\"code\":{}}}}}\n",
        quote(token),
        quote(message),
        code.map(quote).unwrap_or_else(|| "null".into())
    )
}

/// Why a line could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The descriptor was closed (the process exited or closed it).
    Closed,
    /// A line longer than the limit.
    TooLong(usize),
    /// The read failed.
    Io(std::io::Error),
}

/// Read one line (without its newline) of at most `max` bytes into `line`.
/// A longer line is an error once `max` is passed, without reading on.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
    max: usize,
) -> Result<(), ReadError> {
    line.clear();
    loop {
        let buf = reader.fill_buf().await.map_err(ReadError::Io)?;
        if buf.is_empty() {
            return Err(ReadError::Closed);
        }
        let (take, end) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            return Err(ReadError::TooLong(max));
        }
        line.extend_from_slice(&buf[..take]);
        reader.consume(take + usize::from(end));
        if end {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_and_bad_lines_say_why() {
        let done =
            parse(br#"{"type":"done","id":5,"token":"t","result":{"n":12345678901234567890123}}"#)
                .unwrap();
        match done {
            Incoming::Done { id, token, result } => {
                assert_eq!((id, token.as_str()), (5, "t"));
                assert_eq!(
                    result.unwrap().to_string(),
                    r#"{"n":12345678901234567890123}"#
                );
            }
            other => panic!("{other:?}"),
        }
        let e = parse(b"{not json").unwrap_err();
        assert!(e.starts_with("not a JSON protocol message"), "{e}");
        let e = parse(br#"{"type":"done","id":5}"#).unwrap_err();
        assert!(e.contains("\"token\""), "{e}");
        let e = parse(br#"{"type":"launch"}"#).unwrap_err();
        assert!(e.contains("unknown message type \"launch\""), "{e}");
        let e = parse(br#"{"type":"hello","version":1,"tasks":[],"inflight":0}"#).unwrap_err();
        assert!(e.contains("inflight 0"), "{e}");
        let e = parse(br#"{"type":"fail","id":1,"token":"t","retry_after":-1}"#).unwrap_err();
        assert!(e.contains("retry_after"), "{e}");
    }

    #[test]
    fn a_traced_job_line_names_its_context_and_an_untraced_one_does_not() {
        let trace = crate::trace::TraceContext {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: Some("congo=t61rcWkgMzE".into()),
        };
        let mut line = JobLine {
            id: 1,
            token: "t",
            task: "t",
            queue: "q",
            payload: "{}",
            attempt: 1,
            max_attempts: 3,
            deadline: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            tx: false,
            keys: [None, None, None],
            trace: Some(&trace),
            steps: None,
            parent_results: None,
        };
        let v: serde_json::Value = serde_json::from_str(&job(&line)).unwrap();
        assert_eq!(v["traceparent"], trace.traceparent.as_str());
        assert_eq!(v["tracestate"], "congo=t61rcWkgMzE");
        line.trace = None;
        let v: serde_json::Value = serde_json::from_str(&job(&line)).unwrap();
        assert!(
            v.get("traceparent").is_none() && v.get("tracestate").is_none(),
            "{v}"
        );
    }

    #[test]
    fn job_lines_are_one_line_of_json_with_the_payload_as_stored() {
        let line = job(&JobLine {
            id: 1,
            token: "a\"b",
            task: "t\n",
            queue: "q",
            payload: r#"{"big": 12345678901234567890123, "s": "x\ny"}"#,
            attempt: 1,
            max_attempts: 3,
            deadline: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            tx: false,
            keys: [Some("customer:42"), None, Some("tenant\"7")],
            trace: None,
            steps: None,
            parent_results: None,
        });
        assert!(line.ends_with('\n') && !line[..line.len() - 1].contains('\n'));
        assert!(line.contains("12345678901234567890123"), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["token"], "a\"b");
        assert_eq!(v["task"], "t\n");
        assert_eq!(v["payload"]["s"], "x\ny");
        assert_eq!(v["deadline"], "1970-01-01T00:00:00.000Z");
        assert_eq!(
            v["keys"],
            serde_json::json!({"ordering": "customer:42", "unique": null, "limit": "tenant\"7"})
        );
    }

    #[tokio::test]
    async fn a_line_over_the_limit_is_refused_without_reading_on() {
        let data = b"short\nthis line is too long\n".to_vec();
        let mut r = tokio::io::BufReader::new(&data[..]);
        let mut line = Vec::new();
        read_line(&mut r, &mut line, 10).await.unwrap();
        assert_eq!(line, b"short");
        assert!(matches!(
            read_line(&mut r, &mut line, 10).await,
            Err(ReadError::TooLong(10))
        ));
    }
}
