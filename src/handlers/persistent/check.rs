//! The conformance check of a persistent handler (`pgwake protocol check
//! COMMAND [ARGS]`): starts COMMAND exactly as a pool does (fd 3 and 4,
//! its own process group, the explicit environment) and drives it through
//! protocol 1 with the demo tasks `echo`, `sleep` and `crash` that the
//! reference workers serve. No database: the check plays pgwake's side.
//!
//! ```text
//!  process 1: handshake → credits → ping → cancel → stale token → oversize line → drain
//!  process 2: handshake (silently) → crash
//! ```
//!
//! Each check leaves its process idle when it passes; after a failure the
//! process is killed and the next check starts a fresh one, so one fault
//! is reported once, by the check that found it. Everything the candidate
//! wrote that a verdict quotes is escaped and cut.

use std::collections::HashMap;
use std::fmt;
use std::time::{Duration, Instant};

use super::process::{self, Started};
use super::protocol::{self, Incoming, ReadError, PROTOCOL_VERSION};
use crate::error::{Error, Result};
use crate::handlers::exec::escape_line;

/// Default `--process-start-timeout` of the check (as for `pgwake run`).
pub const START_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default `--reply-timeout`: how long a job's answer or a pong may take.
pub const REPLY_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);
/// Default `--cancel-within`: how soon a cancelled job must be answered.
/// Shorter than `pgwake run`'s `--cancel-grace` (10 s): a process that
/// answers near the grace is killed in production by a slow moment.
pub const CANCEL_WITHIN_DEFAULT: Duration = Duration::from_secs(5);

/// How long a `sleep` job is left running before it is cancelled or pinged
/// beside (so that it is running, not queued).
const RUNNING_SETTLE: Duration = Duration::from_millis(200);
/// After a cancel with a stale token (and the pong that shows it was
/// read), how long the job must go on without an answer.
const STALE_WAIT: Duration = Duration::from_millis(500);
/// Seconds of the `sleep` jobs that only a cancel may end.
const LONG_SLEEP_S: u64 = 60;
/// Size of the oversize line's payload: far past any pipe buffer and any
/// default 64 KiB line reader.
const OVERSIZE_BYTES: usize = 1 << 20;
/// Most bytes of something the candidate wrote that a verdict quotes.
const QUOTE_MAX: usize = 120;

/// The checks, in the order they run.
pub const CHECKS: [&str; 8] = [
    "handshake",
    "credits",
    "ping",
    "cancel",
    "stale token",
    "oversize line",
    "drain",
    "crash",
];

/// The tasks a candidate must serve.
pub const DEMO_TASKS: [&str; 3] = ["echo", "sleep", "crash"];

/// How the check runs the candidate.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Options {
    /// The candidate must say hello within this, each time it is started.
    pub start_timeout: Duration,
    /// A job's answer, or a pong, must come within this.
    pub reply_timeout: Duration,
    /// A cancelled job must be answered within this.
    pub cancel_within: Duration,
    /// Longest line the candidate may write, in bytes.
    pub line_max: usize,
    /// Variables of this environment passed through (as `--exec-env`).
    pub passed_env: Vec<String>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            start_timeout: START_TIMEOUT_DEFAULT,
            reply_timeout: REPLY_TIMEOUT_DEFAULT,
            cancel_within: CANCEL_WITHIN_DEFAULT,
            line_max: protocol::LINE_MAX_DEFAULT,
            passed_env: Vec::new(),
        }
    }
}

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// It passed; `detail` may say what was seen.
    Passed {
        /// What was seen (may be empty).
        detail: String,
    },
    /// It failed, and why.
    Failed {
        /// Why, naming what the candidate did or did not do.
        why: String,
    },
    /// It could not run (the handshake failed).
    Skipped {
        /// Why.
        why: String,
    },
}

/// One check and its verdict.
#[derive(Debug, Clone)]
pub struct Check {
    /// One of [`CHECKS`].
    pub name: &'static str,
    /// What it found.
    pub verdict: Verdict,
}

impl fmt::Display for Check {
    /// `cancel: ok`, `cancel: FAILED: why`, `crash: skipped: why`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.verdict {
            Verdict::Passed { detail } if detail.is_empty() => write!(f, "{}: ok", self.name),
            Verdict::Passed { detail } => write!(f, "{}: ok ({detail})", self.name),
            Verdict::Failed { why } => write!(f, "{}: FAILED: {why}", self.name),
            Verdict::Skipped { why } => write!(f, "{}: skipped: {why}", self.name),
        }
    }
}

/// Every check's verdict, in [`CHECKS`] order.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The checks run (or skipped).
    pub checks: Vec<Check>,
}

impl Report {
    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty()
            && self
                .checks
                .iter()
                .all(|c| matches!(c.verdict, Verdict::Passed { .. }))
    }

    /// The names of the checks that did not pass.
    pub fn failed(&self) -> Vec<&'static str> {
        self.checks
            .iter()
            .filter(|c| !matches!(c.verdict, Verdict::Passed { .. }))
            .map(|c| c.name)
            .collect()
    }
}

/// Run every check against `command` (program and arguments). `Err` only
/// for what stops the check before it starts (a command not found: a
/// configuration error); everything the candidate does is in the report.
pub async fn run(command: &[String], opts: &Options) -> Result<Report> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Error::Config("protocol check: no command given".into()))?;
    crate::handlers::exec::check_names(&opts.passed_env)?;
    let resolved = crate::handlers::exec::resolve(program).ok_or_else(|| {
        Error::Config(format!(
            "protocol check: command {program:?} not found or not executable (checked PATH)"
        ))
    })?;
    let spec = process::Spec {
        program: resolved,
        args: args.to_vec(),
        passed_env: opts.passed_env.clone(),
        label: escape_line(shell_words::join(command).as_bytes()).into(),
        line_max: opts.line_max,
    };
    let mut checker = Checker {
        spec,
        opts: opts.clone(),
        next_id: 1,
    };
    let mut checks = Vec::new();
    let mut verdict = |name, result: std::result::Result<String, String>| {
        checks.push(Check {
            name,
            verdict: match result {
                Ok(detail) => Verdict::Passed { detail },
                Err(why) => Verdict::Failed { why },
            },
        });
    };
    let mut session = match checker.open().await {
        Ok((session, hello)) => {
            verdict("handshake", Ok(hello));
            Some(session)
        }
        Err(why) => {
            verdict("handshake", Err(why));
            let skipped = CHECKS[1..].iter().map(|name| Check {
                name,
                verdict: Verdict::Skipped {
                    why: "the handshake failed".into(),
                },
            });
            checks.extend(skipped);
            return Ok(Report { checks });
        }
    };
    for name in &CHECKS[1..] {
        // The crash needs a process of its own; the others reuse an idle one.
        if *name == "crash" {
            session = None;
        }
        let mut s = match session.take() {
            Some(s) => s,
            None => match checker.open().await {
                Ok((s, _)) => s,
                Err(why) => {
                    verdict(
                        name,
                        Err(format!("a fresh process failed its handshake: {why}")),
                    );
                    continue;
                }
            },
        };
        let result = match *name {
            "credits" => checker.credits(&mut s).await,
            "ping" => checker.ping(&mut s).await,
            "cancel" => checker.cancel(&mut s).await,
            "stale token" => checker.stale_token(&mut s).await,
            "oversize line" => checker.oversize(&mut s).await,
            "drain" => checker.drain(&mut s).await,
            _ => checker.crash(&mut s).await,
        };
        // A process that failed a check (or exited) is not trusted further.
        if result.is_ok() && !s.dirty && !matches!(*name, "drain" | "crash") {
            session = Some(s);
        }
        verdict(name, result);
    }
    Ok(Report { checks })
}

/// The candidate's answer to a job.
#[derive(Debug)]
enum Answer {
    Done(Option<serde_json::Value>),
    Fail(String),
}

/// What the candidate did next.
enum Heard {
    Message(Incoming),
    /// A line that is no protocol message.
    Bad(String),
    /// It exited (its status and stderr tail).
    Exited(String),
    Silent,
}

/// A started candidate past its handshake.
struct Session {
    started: Started,
    inflight: usize,
    /// Left in a state the next check cannot trust (set by a check that
    /// passed but could not tidy up).
    dirty: bool,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.started.kill();
    }
}

impl Session {
    fn send(&self, line: String) {
        // A closed fd 3 shows up as the process's exit on the next read.
        let _ = self.started.out.send(line);
    }

    /// The next thing the candidate does within `within`.
    async fn next(&mut self, within: Duration) -> Heard {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let heard = self.next_line(deadline).await;
            // Progress is not an answer: a process may report any time
            // a job of its runs (pgwake checks its bounds when it runs).
            if !matches!(heard, Heard::Message(Incoming::Progress { .. })) {
                return heard;
            }
        }
    }

    async fn next_line(&mut self, deadline: tokio::time::Instant) -> Heard {
        match tokio::time::timeout_at(deadline, self.started.lines.recv()).await {
            Err(_) => Heard::Silent,
            Ok(Some(Ok(line))) => match protocol::parse(&line) {
                Ok(m) => Heard::Message(m),
                Err(e) => Heard::Bad(e),
            },
            Ok(Some(Err(ReadError::TooLong(max)))) => {
                Heard::Bad(format!("wrote a line longer than {max} bytes"))
            }
            Ok(Some(Err(ReadError::Io(e)))) => Heard::Bad(format!("reading its fd 4 failed: {e}")),
            Ok(None) | Ok(Some(Err(ReadError::Closed))) => Heard::Exited(self.ended().await),
        }
    }

    /// How it ended (waiting a moment for the exit after fd 4 closed).
    async fn ended(&mut self) -> String {
        let status = tokio::time::timeout(Duration::from_secs(2), self.started.child.wait()).await;
        let status = match status {
            Ok(Ok(s)) => process::describe_status(s),
            Ok(Err(e)) => format!("could not be waited for ({e})"),
            Err(_) => "closed its fd 4 but did not exit".into(),
        };
        // Let the last of its stderr reach the tail.
        tokio::time::sleep(Duration::from_millis(50)).await;
        match self.started.stderr_tail() {
            t if t.is_empty() => status,
            t => format!("{status}; stderr: {}", cut(&t)),
        }
    }

    /// Wait for the answers to `jobs` (id → token), within `within`.
    async fn answers(
        &mut self,
        jobs: &HashMap<i64, String>,
        within: Duration,
    ) -> std::result::Result<HashMap<i64, Answer>, String> {
        let deadline = Instant::now() + within;
        let mut got = HashMap::new();
        while got.len() < jobs.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let waiting = || {
                let mut ids: Vec<i64> = jobs
                    .keys()
                    .filter(|i| !got.contains_key(*i))
                    .copied()
                    .collect();
                ids.sort_unstable();
                ids.iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let (id, token, answer) = match self.next(left).await {
                Heard::Silent => {
                    return Err(format!(
                        "no answer for job {} within {}",
                        waiting(),
                        humantime::format_duration(within)
                    ));
                }
                Heard::Exited(how) => {
                    return Err(format!("exited ({how}) with job {} unanswered", waiting()))
                }
                Heard::Bad(why) => return Err(self.protocol_error(why)),
                Heard::Message(Incoming::Pong { .. }) => continue,
                Heard::Message(Incoming::Done { id, token, result }) => {
                    (id, token, Answer::Done(result))
                }
                Heard::Message(Incoming::Fail {
                    id, token, error, ..
                }) => (id, token, Answer::Fail(error)),
                Heard::Message(other) => return Err(self.unexpected(&other)),
            };
            let Some(want) = jobs.get(&id) else {
                return Err(format!("answered job {id}, which it was not given"));
            };
            if got.contains_key(&id) {
                return Err(format!("answered job {id} twice"));
            }
            if &token != want {
                return Err(format!(
                    "answered job {id} with token {}, not its job message's {want:?}: every reply must carry the token of its job",
                    quote(&token)
                ));
            }
            got.insert(id, answer);
        }
        Ok(got)
    }

    /// Wait for the pong of ping `seq`: the next message must be it (the
    /// check never has an answer owed while it pings).
    async fn pong(&mut self, seq: u64, within: Duration) -> std::result::Result<(), String> {
        match self.next(within).await {
            Heard::Message(Incoming::Pong { seq: Some(s) }) if s == seq => Ok(()),
            Heard::Message(Incoming::Pong { seq: Some(s) }) => {
                Err(format!("answered ping {seq} with pong {s}"))
            }
            Heard::Message(Incoming::Pong { seq: None }) => Err(format!(
                "answered ping {seq} with a pong without its \"seq\""
            )),
            Heard::Silent => Err(format!(
                "no pong within {} of ping {seq}",
                humantime::format_duration(within)
            )),
            Heard::Exited(how) => Err(format!("exited ({how}) instead of answering ping {seq}")),
            Heard::Bad(why) => Err(self.protocol_error(why)),
            Heard::Message(other) => Err(match other.job() {
                Some((id, _)) => format!("answered job {id} while ping {seq} waited for its pong"),
                None => self.unexpected(&other),
            }),
        }
    }

    fn protocol_error(&self, why: String) -> String {
        format!("protocol error: {why}")
    }

    fn unexpected(&self, msg: &Incoming) -> String {
        match msg {
            Incoming::Hello { .. } => "sent a second hello".into(),
            Incoming::Sql { id, .. } => {
                format!("sent sql for job {id}, which was given with \"tx\": false")
            }
            other => format!("sent an unexpected {}", kind(other)),
        }
    }
}

/// Runs the checks, numbering jobs across processes.
struct Checker {
    spec: process::Spec,
    opts: Options,
    next_id: i64,
}

impl Checker {
    /// Start the candidate and complete its handshake. `Ok`: the session
    /// and what its hello said.
    async fn open(&mut self) -> std::result::Result<(Session, String), String> {
        let mut started =
            process::start(&self.spec, 0).map_err(|e| format!("could not be started: {e}"))?;
        let hello = process::hello(&mut started, self.opts.start_timeout).await;
        let (version, tasks, inflight, _wants) = match hello {
            Ok(h) => h,
            Err(why) => {
                started.kill();
                return Err(why);
            }
        };
        let session = Session {
            started,
            inflight,
            dirty: false,
        };
        if version != PROTOCOL_VERSION {
            return Err(format!(
                "it speaks protocol version {version}; pgwake speaks {PROTOCOL_VERSION} (pgwake run would exit 2)"
            ));
        }
        let missing: Vec<&str> = DEMO_TASKS
            .iter()
            .copied()
            .filter(|t| !tasks.iter().any(|s| s == t || s == "*"))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "its hello does not list the demo task(s) {} that the check runs (it lists {})",
                missing.join(", "),
                cut(&format!("{tasks:?}"))
            ));
        }
        session.send(protocol::welcome(0, 5000));
        Ok((
            session,
            format!(
                "version {version}, {} task(s), inflight {inflight}",
                tasks.len()
            ),
        ))
    }

    /// A new job of `task`: its id, token and line.
    fn job(&mut self, task: &str, payload: &str) -> (i64, String, String) {
        let id = self.next_id;
        self.next_id += 1;
        let token = format!("{:016x}", rand::random::<u64>());
        let line = protocol::job(&protocol::JobLine {
            id,
            token: &token,
            task,
            queue: "protocol-check",
            payload,
            attempt: 1,
            max_attempts: 1,
            deadline: chrono::Utc::now() + chrono::Duration::hours(1),
            tx: false,
            keys: [None, None, None],
            trace: None,
            steps: None,
            parent_results: None,
        });
        (id, token, line)
    }

    /// As many `echo` jobs at once as its hello's inflight, each answered
    /// with its payload, every digit kept.
    async fn credits(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        let n = s.inflight;
        let mut jobs = HashMap::new();
        let mut payloads = HashMap::new();
        for i in 0..n {
            let payload = credit_payload(i);
            let (id, token, line) = self.job("echo", &payload);
            s.send(line);
            jobs.insert(id, token);
            payloads.insert(id, payload);
        }
        let answers = s.answers(&jobs, self.opts.reply_timeout).await?;
        for (id, answer) in answers {
            echoed(id, &payloads[&id], answer)?;
        }
        Ok(format!(
            "{n} echo job(s) at once, each answered with its payload"
        ))
    }

    /// A pong with the ping's seq, idle and while a job runs.
    async fn ping(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        s.send(protocol::ping(1));
        s.pong(1, self.opts.reply_timeout).await?;
        let (id, token) = self.long_sleep(s).await;
        s.send(protocol::ping(2));
        s.pong(2, self.opts.reply_timeout).await.map_err(|e| {
            format!(
                "{e} while a sleep job ran (a process must keep reading fd 3 while its jobs run)"
            )
        })?;
        // Leave it idle; a slow cancel is the cancel check's to report.
        s.send(protocol::cancel(id, &token, "cancelled"));
        if s.answers(&HashMap::from([(id, token)]), self.opts.cancel_within)
            .await
            .is_err()
        {
            s.dirty = true;
        }
        Ok("idle and while a job runs".into())
    }

    /// A running `sleep` job of a minute, cancelled, answered soon.
    async fn cancel(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        let (id, token) = self.long_sleep(s).await;
        let t0 = Instant::now();
        s.send(protocol::cancel(id, &token, "cancelled"));
        s.answers(&HashMap::from([(id, token)]), self.opts.cancel_within)
            .await
            .map_err(|e| format!("after a cancel of a running {LONG_SLEEP_S} s sleep job: {e}"))?;
        Ok(format!("answered in {} ms", t0.elapsed().as_millis()))
    }

    /// A cancel with a wrong token leaves the job running; the real one
    /// then ends it.
    async fn stale_token(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        let (id, token) = self.long_sleep(s).await;
        s.send(protocol::cancel(
            id,
            &format!("stale-{}", &token[..8]),
            "cancelled",
        ));
        // The pong shows the stale cancel was read (lines are read in order).
        s.send(protocol::ping(3));
        let stopped = |e: String| {
            if e.contains(&format!("answered job {id}")) {
                format!("a cancel with a stale token stopped job {id}: a process must act only on a cancel whose token is its job's")
            } else {
                e
            }
        };
        s.pong(3, self.opts.reply_timeout).await.map_err(stopped)?;
        match s.next(STALE_WAIT).await {
            Heard::Silent => {}
            Heard::Message(Incoming::Done { id: i, .. } | Incoming::Fail { id: i, .. })
                if i == id =>
            {
                return Err(stopped(format!("answered job {id}")))
            }
            Heard::Exited(how) => {
                return Err(format!("exited ({how}) after a cancel with a stale token"))
            }
            Heard::Bad(why) => return Err(s.protocol_error(why)),
            Heard::Message(other) => return Err(s.unexpected(&other)),
        }
        s.send(protocol::cancel(id, &token, "cancelled"));
        s.answers(&HashMap::from([(id, token)]), self.opts.cancel_within)
            .await
            .map_err(|e| format!("after the real cancel that followed the stale one: {e}"))?;
        Ok("ignored; the real cancel was answered".into())
    }

    /// An `echo` job whose line is over 1 MiB, answered intact.
    async fn oversize(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        let payload = oversize_payload();
        let (id, token, line) = self.job("echo", &payload);
        let bytes = line.len();
        s.send(line);
        let mut answers = s
            .answers(&HashMap::from([(id, token)]), self.opts.reply_timeout)
            .await?;
        echoed(id, &payload, answers.remove(&id).expect("answered"))?;
        Ok(format!("a {bytes}-byte job line"))
    }

    /// A drain with a short job in flight: the job is answered, then the
    /// process exits 0.
    async fn drain(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        let (id, token, line) = self.job("sleep", r#"{"secs":0.2}"#);
        s.send(line);
        s.send(protocol::drain());
        s.answers(&HashMap::from([(id, token)]), self.opts.reply_timeout)
            .await
            .map_err(|e| format!("after a drain with a 0.2 s sleep job in flight: {e}"))?;
        match s.next(self.opts.reply_timeout).await {
            Heard::Exited(how) if how.starts_with("exit status 0") => Ok("exited 0".into()),
            Heard::Exited(how) => Err(format!(
                "exited after its drain but not with status 0: {how}"
            )),
            Heard::Silent => Err(format!(
                "still running {} after its drain with nothing in flight; it must exit 0",
                humantime::format_duration(self.opts.reply_timeout)
            )),
            Heard::Bad(why) => Err(s.protocol_error(why)),
            Heard::Message(other) => Err(s.unexpected(&other)),
        }
    }

    /// A fresh process given a `crash` job exits.
    async fn crash(&mut self, s: &mut Session) -> std::result::Result<String, String> {
        let (id, _, line) = self.job("crash", "{}");
        s.send(line);
        loop {
            match s.next(self.opts.reply_timeout).await {
                Heard::Exited(how) => return Ok(format!("exited: {}", cut(&how))),
                Heard::Silent => {
                    return Err(format!(
                        "still running {} after crash job {id}: the demo task crash must make the process exit at once",
                        humantime::format_duration(self.opts.reply_timeout)
                    ))
                }
                // Whatever it said first, it must still exit.
                Heard::Message(_) => continue,
                Heard::Bad(why) => return Err(s.protocol_error(why)),
            }
        }
    }

    /// Start a `sleep` job of [`LONG_SLEEP_S`] and give it time to run.
    async fn long_sleep(&mut self, s: &mut Session) -> (i64, String) {
        let (id, token, line) = self.job("sleep", &format!("{{\"secs\":{LONG_SLEEP_S}}}"));
        s.send(line);
        tokio::time::sleep(RUNNING_SETTLE).await;
        (id, token)
    }
}

/// The payload of credit job `i`: numbers an IEEE double holds exactly
/// but only with every digit printed (17 significant digits), text that
/// needs escapes, nesting. Integers past 2^53 are left out: JavaScript's
/// `JSON.parse` cannot keep them, and pgwake itself passes every digit.
fn credit_payload(i: usize) -> String {
    format!(
        r#"{{"i":{i},"max_safe":9007199254740991,"neg":-9007199254740991,"sum":0.30000000000000004,"small":0.0001234,"text":"é ü \u2028 \"q\" \\ \t ✓","nested":[true,false,null,{{"a":[]}}],"empty":{{}}}}"#
    )
}

/// `{"blob":"…"}` of [`OVERSIZE_BYTES`] of varied ASCII.
fn oversize_payload() -> String {
    let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let blob: String = (0..OVERSIZE_BYTES)
        .map(|i| alphabet[(i * 7 + i / 36) % alphabet.len()] as char)
        .collect();
    format!(r#"{{"n":1,"blob":"{blob}"}}"#)
}

/// `Ok` when echo job `id` was answered done with `payload` as its result.
fn echoed(id: i64, payload: &str, answer: Answer) -> std::result::Result<(), String> {
    let sent: serde_json::Value =
        serde_json::from_str(payload).expect("the check's payload is JSON");
    match answer {
        Answer::Done(Some(got)) => match difference(&sent, &got, String::new()) {
            None => Ok(()),
            Some(d) => Err(format!("echo job {id}'s result is not its payload: {d}")),
        },
        Answer::Done(None) => Err(format!(
            "answered echo job {id} done without a result; echo's result is its payload"
        )),
        Answer::Fail(error) => Err(format!("answered echo job {id} fail: {}", quote(&error))),
    }
}

/// Where `got` first differs from `sent` (numbers compared digit by digit).
fn difference(sent: &serde_json::Value, got: &serde_json::Value, at: String) -> Option<String> {
    use serde_json::Value;
    let here = || {
        if at.is_empty() {
            "/".to_owned()
        } else {
            at.clone()
        }
    };
    match (sent, got) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => {
                        if let Some(d) = difference(v, w, format!("{at}/{k}")) {
                            return Some(d);
                        }
                    }
                    None => return Some(format!("{at}/{k} is missing")),
                }
            }
            b.keys()
                .find(|k| !a.contains_key(*k))
                .map(|k| format!("{}/{} was added", at, quote(k)))
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (v, w))| difference(v, w, format!("{at}/{i}"))),
        (Value::String(a), Value::String(b)) if a.len() > QUOTE_MAX && a != b => Some(format!(
            "at {}: a string of {} bytes came back as one of {} bytes{}",
            here(),
            a.len(),
            b.len(),
            if a.len() == b.len() {
                " with other bytes"
            } else {
                ""
            }
        )),
        _ if sent == got => None,
        _ => Some(format!(
            "at {}: sent {}, got {}",
            here(),
            cut(&sent.to_string()),
            cut(&got.to_string())
        )),
    }
}

/// What the candidate wrote, escaped, quoted and cut.
fn quote(s: &str) -> String {
    format!("\"{}\"", cut(s))
}

/// Escaped, at most [`QUOTE_MAX`] characters.
fn cut(s: &str) -> String {
    let text = escape_line(s.as_bytes());
    if text.chars().count() <= QUOTE_MAX {
        return text;
    }
    let mut c: String = text.chars().take(QUOTE_MAX - 1).collect();
    c.push('…');
    c
}

/// A message's type, for an error.
fn kind(msg: &Incoming) -> &'static str {
    match msg {
        Incoming::Hello { .. } => "hello",
        Incoming::Done { .. } => "done",
        Incoming::Fail { .. } => "fail",
        Incoming::Snooze { .. } => "snooze",
        Incoming::Progress { .. } => "progress",
        Incoming::Pong { .. } => "pong",
        Incoming::Sql { .. } => "sql",
        Incoming::Step { .. } => "step",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_difference_names_the_path_and_both_numbers() {
        let sent: serde_json::Value = serde_json::from_str(&credit_payload(0)).unwrap();
        let mut got = sent.clone();
        got["sum"] = serde_json::from_str("0.3").unwrap();
        let d = difference(&sent, &got, String::new()).unwrap();
        assert_eq!(d, "at /sum: sent 0.30000000000000004, got 0.3");
        assert_eq!(difference(&sent, &sent.clone(), String::new()), None);
        let sent: serde_json::Value = serde_json::from_str(&oversize_payload()).unwrap();
        let mut got = sent.clone();
        got["blob"] = "short".into();
        let d = difference(&sent, &got, String::new()).unwrap();
        assert!(d.starts_with("at /blob: a string of 1048576 bytes"), "{d}");
    }
}
