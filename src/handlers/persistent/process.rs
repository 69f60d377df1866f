//! One persistent handler process: started with its protocol pipes on fd 3
//! and 4, its stdout and stderr read into the worker's log, its lines read
//! and parsed, and its end (exit, kill) reported once.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::io::{AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::protocol::{self, Incoming, ReadError, PROCESS_IN_FD, PROCESS_OUT_FD};
use crate::handlers::exec::escape_line;

/// The log target of what handler processes print and of protocol errors.
pub const LOG_TARGET: &str = "pgwake::persistent";

/// Longest stdout/stderr line logged; the rest is dropped with a note.
const OUTPUT_LINE_MAX: usize = 4096;

/// Most bytes of queued lines written to a process at once.
const WRITE_COALESCE_MAX: usize = 64 * 1024;

/// How much of a process's stderr is kept for an error message.
const STDERR_TAIL: usize = 2048;

/// What a job in flight waits for.
#[derive(Debug)]
pub(super) enum Reply {
    /// The process answered done.
    Done(Option<serde_json::Value>),
    /// The process answered fail.
    Fail {
        error: String,
        for_good: bool,
        retry_after: Option<f64>,
    },
    /// The process answered snooze (seconds).
    Snooze(f64),
    /// The process reported the job's progress (not an answer).
    Progress {
        value: serde_json::Value,
        message: Option<String>,
    },
    /// The process sent a step to record.
    Step {
        name: String,
        output: serde_json::Value,
    },
    /// The process asks to run SQL in the job's transaction.
    Sql {
        seq: u64,
        sql: String,
        params: Vec<serde_json::Value>,
    },
    /// The process is gone with the job in flight.
    Gone(Gone),
}

/// How a job learns its process is gone.
#[derive(Debug, Clone)]
pub(super) struct Gone {
    /// What happened, for `last_error` and the log.
    pub(super) cause: String,
    /// This job is the culprit: it was alone in flight (or isolated), so
    /// the run counts as a failed attempt.
    pub(super) culprit: bool,
}

/// A job given to the process and not answered yet.
#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) token: String,
    pub(super) task: String,
    pub(super) replies: mpsc::UnboundedSender<Reply>,
    /// pgwake stopped caring (cancel, timeout): the process owes an
    /// answer within the grace period, which is then dropped.
    pub(super) cancelled: bool,
}

/// A started process.
#[derive(Debug)]
pub(super) struct Proc {
    /// Its number in the pool (`PGWAKE_PROCESS`).
    pub(super) index: usize,
    pub(super) pid: i32,
    /// Jobs it takes at once (its hello).
    pub(super) capacity: usize,
    /// Tasks it serves (its hello).
    pub(super) tasks: Vec<String>,
    pub(super) inflight: Mutex<HashMap<i64, InFlight>>,
    /// The last job it was given while it had nothing else in flight, until
    /// it is given another beside it: what it prints after answering is
    /// still tagged with that job.
    pub(super) alone: Mutex<Option<(i64, String)>>,
    /// Replies already given, recently (for duplicates), and the tokens
    /// of jobs that went elsewhere (stale replies), bounded.
    pub(super) answered: Mutex<std::collections::VecDeque<(i64, String)>>,
    /// Lines to write to its fd 3.
    out: mpsc::UnboundedSender<String>,
    /// When it last said anything.
    pub(super) heard: Mutex<Instant>,
    /// No new jobs: draining for recycling, or dying.
    pub(super) closed: AtomicBool,
    /// Serving one isolated job: nothing else may be given to it.
    pub(super) isolated: AtomicBool,
    /// Jobs given to it so far.
    pub(super) given: AtomicU64,
    /// Why it is being killed (set before the kill).
    pub(super) kill_cause: Mutex<Option<(Kill, String)>>,
    /// The end of its stderr.
    pub(super) stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// Its stdout and stderr.
    outputs: Vec<Arc<Output>>,
    pub(super) started: Instant,
}

/// Why pgwake kills a process: the restart metric's `cause`, and whether
/// the jobs in flight on it may be blamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kill {
    /// It broke the protocol.
    Protocol,
    /// It answered nothing, not even pings.
    Unresponsive,
    /// It did not stop a cancelled job within the grace period.
    CancelGrace,
    /// The pool is stopping.
    Stopping,
    /// Anything else (a closed descriptor, a drain not followed by an exit).
    Other,
}

impl Kill {
    /// The `cause` label of `pgwake_persistent_restarts_total`.
    pub(super) fn label(self) -> &'static str {
        match self {
            Kill::Protocol => "protocol_error",
            Kill::Unresponsive => "unresponsive",
            Kill::CancelGrace => "cancel_grace",
            Kill::Stopping | Kill::Other => "killed",
        }
    }

    /// Whether a job alone on the process may be blamed for its end: not
    /// when it was killed for another job's cancel, or by a stop.
    pub(super) fn blames(self) -> bool {
        !matches!(self, Kill::CancelGrace | Kill::Stopping)
    }
}

/// What the pool hears from a process's reader.
#[derive(Debug)]
pub(super) enum Event {
    /// A line it could not accept: the process must go.
    ProtocolError(String),
}

impl Proc {
    /// Queue a line for the process. False when its fd 3 is closed.
    pub(super) fn send(&self, line: String) -> bool {
        self.out.send(line).is_ok()
    }

    /// Whether its hello listed `task` (or `*`).
    pub(super) fn serves(&self, task: &str) -> bool {
        self.tasks.iter().any(|t| t == task || t == "*")
    }

    /// Jobs in flight (cancelled ones included: they hold a slot until
    /// answered).
    pub(super) fn load(&self) -> usize {
        self.inflight.lock().expect("inflight").len()
    }

    /// Whether a new job may go to it now (`isolate`: only when it has
    /// nothing in flight).
    pub(super) fn has_room(&self, isolate: bool) -> bool {
        if self.closed.load(Ordering::Acquire) || self.isolated.load(Ordering::Acquire) {
            return false;
        }
        let load = self.load();
        if isolate {
            load == 0
        } else {
            load < self.capacity
        }
    }

    /// Kill its process group, saying why (the first cause set wins).
    pub(super) fn kill(&self, kind: Kill, cause: &str) {
        {
            let mut k = self.kill_cause.lock().expect("kill cause");
            if k.is_none() {
                *k = Some((kind, cause.to_owned()));
            }
        }
        self.closed.store(true, Ordering::Release);
        // SAFETY: plain syscalls; the process leads its own group and is
        // not reaped before its monitor sees it exit.
        unsafe {
            libc::kill(-self.pid, libc::SIGKILL);
            libc::kill(self.pid, libc::SIGKILL);
        }
    }

    /// Resident memory in bytes (`/proc/PID/status`, `VmRSS`).
    pub(super) fn rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }

    /// Log what its stdout and stderr hold now, before a job it runs alone
    /// is let go: those lines are that job's.
    pub(super) fn catch_up_output(&self) {
        for output in &self.outputs {
            output.read_now();
        }
    }

    /// The job the process is running, when it runs exactly one (or last
    /// ran alone, when it runs none): the tag of what it prints.
    fn only_job(&self) -> Option<(i64, String)> {
        let inflight = self.inflight.lock().expect("inflight");
        match inflight.len() {
            1 => inflight.iter().next().map(|(id, f)| (*id, f.task.clone())),
            0 => self.alone.lock().expect("alone").clone(),
            _ => None,
        }
    }

    /// Remember an answered (or re-routed) job's token.
    pub(super) fn remember(&self, id: i64, token: String) {
        let mut a = self.answered.lock().expect("answered");
        if a.len() >= 4096 {
            a.pop_front();
        }
        a.push_back((id, token));
    }
}

/// What starting a process needs.
#[derive(Debug, Clone)]
pub(super) struct Spec {
    pub(super) program: std::path::PathBuf,
    pub(super) args: Vec<String>,
    pub(super) passed_env: Vec<String>,
    pub(super) label: Arc<str>,
    pub(super) line_max: usize,
}

/// The lines a process writes, read ahead.
pub(super) type Lines = mpsc::Receiver<Result<Vec<u8>, ReadError>>;

/// A process started, before its hello.
pub(super) struct Started {
    pub(super) child: Child,
    pub(super) pid: i32,
    pub(super) lines: Lines,
    pub(super) out: mpsc::UnboundedSender<String>,
    pub(super) stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// Cancelled once its stderr is closed (all of it is in the tail).
    stderr_closed: tokio_util::sync::CancellationToken,
    /// Who the stdout/stderr lines are tagged with, once known.
    pub(super) tag: Arc<Mutex<Option<std::sync::Weak<Proc>>>>,
    /// Its stdout and stderr.
    outputs: Vec<Arc<Output>>,
}

/// A pipe with both ends close-on-exec, the ends moved above the
/// descriptors the child gets (so placing them on 3 and 4 cannot clobber
/// one with the other).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: plain syscall with a valid array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are ours.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((high(r)?, high(w)?))
}

/// `fd` duplicated to a descriptor of 10 or more, close-on-exec.
fn high(fd: OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: plain syscall on a descriptor we own.
    let n = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just opened, ours.
    Ok(unsafe { OwnedFd::from_raw_fd(n) })
}

fn nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: plain syscalls on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Start process `index` of `spec`: its own process group, killed with the
/// worker (`PR_SET_PDEATHSIG`), fd 3 and 4 its protocol pipes, stdin
/// `/dev/null`, stdout and stderr logged.
pub(super) fn start(spec: &Spec, index: usize) -> std::io::Result<Started> {
    let (to_child_r, to_child_w) = pipe()?;
    let (from_child_r, from_child_w) = pipe()?;
    let (in_fd, out_fd) = (to_child_r.as_raw_fd(), from_child_w.as_raw_fd());
    let mut cmd = Command::new(&spec.program);
    crate::handlers::exec::explicit_env(cmd.as_std_mut(), &spec.passed_env);
    cmd.args(&spec.args)
        .env("PGWAKE_PROTOCOL", protocol::PROTOCOL_VERSION.to_string())
        .env("PGWAKE_PROTOCOL_IN", PROCESS_IN_FD.to_string())
        .env("PGWAKE_PROTOCOL_OUT", PROCESS_OUT_FD.to_string())
        .env("PGWAKE_PROCESS", index.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: only async-signal-safe calls (prctl, dup2) in the child.
    unsafe {
        cmd.as_std_mut().pre_exec(move || {
            // If the worker dies (kill -9, OOM), its processes go with it.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            if libc::dup2(in_fd, PROCESS_IN_FD) < 0 || libc::dup2(out_fd, PROCESS_OUT_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    drop(to_child_r);
    drop(from_child_w);
    let pid = child.id().map(|p| p as i32).unwrap_or(0);

    let tag: Arc<Mutex<Option<std::sync::Weak<Proc>>>> = Arc::new(Mutex::new(None));
    let stderr_tail = Arc::new(Mutex::new(Vec::new()));
    let stderr_closed = tokio_util::sync::CancellationToken::new();
    let output = |stream: OwnedFd, name, tail| -> std::io::Result<Arc<Output>> {
        Ok(Arc::new(Output {
            pipe: tokio::net::unix::pipe::Receiver::from_owned_fd(stream)?,
            name,
            label: spec.label.clone(),
            index,
            tag: tag.clone(),
            tail,
            line: Mutex::default(),
        }))
    };
    let mut outputs = Vec::with_capacity(2);
    if let Some(stdout) = child.stdout.take() {
        let out = output(stdout.into_owned_fd()?, "stdout", None)?;
        tokio::spawn(out.clone().run());
        outputs.push(out);
    }
    if let Some(stderr) = child.stderr.take() {
        let err = output(stderr.into_owned_fd()?, "stderr", Some(stderr_tail.clone()))?;
        let closed = stderr_closed.clone();
        let read = err.clone();
        tokio::spawn(async move {
            read.run().await;
            closed.cancel();
        });
        outputs.push(err);
    } else {
        stderr_closed.cancel();
    }

    nonblocking(&to_child_w)?;
    nonblocking(&from_child_r)?;
    let writer = tokio::net::unix::pipe::Sender::from_owned_fd(to_child_w)?;
    let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(from_child_r)?;
    let (out, mut out_rx) = mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        let mut writer = writer;
        while let Some(line) = out_rx.recv().await {
            // The lines queued meanwhile go in the same write (the jobs of
            // one claim, a ping beside them): one wake-up of the process
            // for all of them, not one each.
            let mut bytes = line.into_bytes();
            while bytes.len() < WRITE_COALESCE_MAX {
                match out_rx.try_recv() {
                    Ok(more) => bytes.extend_from_slice(more.as_bytes()),
                    Err(_) => break,
                }
            }
            if writer.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    // Lines are read ahead into a small channel: the reader stops at a
    // line over the limit or when the pipe closes.
    let (lines_tx, lines) = mpsc::channel(64);
    let max = spec.line_max;
    tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(64 * 1024, reader);
        loop {
            let mut line = Vec::new();
            let r = protocol::read_line(&mut reader, &mut line, max).await;
            let end = r.is_err();
            if lines_tx.send(r.map(|()| line)).await.is_err() || end {
                break;
            }
        }
    });
    Ok(Started {
        child,
        pid,
        lines,
        out,
        stderr_tail,
        stderr_closed,
        tag,
        outputs,
    })
}

impl Started {
    /// The started process, its hello read: a `Proc`.
    pub(super) fn into_proc(
        self,
        index: usize,
        capacity: usize,
        tasks: Vec<String>,
    ) -> (Arc<Proc>, Child, Lines) {
        let proc = Arc::new(Proc {
            index,
            pid: self.pid,
            capacity,
            tasks,
            inflight: Mutex::new(HashMap::new()),
            alone: Mutex::new(None),
            answered: Mutex::new(Default::default()),
            out: self.out,
            heard: Mutex::new(Instant::now()),
            closed: AtomicBool::new(false),
            isolated: AtomicBool::new(false),
            given: AtomicU64::new(0),
            kill_cause: Mutex::new(None),
            stderr_tail: self.stderr_tail,
            outputs: self.outputs,
            started: Instant::now(),
        });
        *self.tag.lock().expect("tag") = Some(Arc::downgrade(&proc));
        (proc, self.child, self.lines)
    }

    /// Its stderr tail, escaped, for an error message.
    pub(super) fn stderr_tail(&self) -> String {
        tail_text(&self.stderr_tail)
    }

    /// Why it exited before its hello: its exit status and the end of its
    /// stderr (read to its end first, for at most a second).
    async fn exited_early(&self, status: std::io::Result<std::process::ExitStatus>) -> String {
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(1),
            self.stderr_closed.cancelled(),
        )
        .await;
        let status = match status {
            Ok(s) => describe_status(s),
            Err(e) => format!("could not be waited for ({e})"),
        };
        let tail = self.stderr_tail();
        if tail.is_empty() {
            format!("exited before its hello: {status}")
        } else {
            format!("exited before its hello: {status}; stderr: {tail}")
        }
    }

    /// Kill its process group (it leads one), before any `Proc` exists.
    pub(super) fn kill(&self) {
        if self.pid > 0 {
            // SAFETY: plain syscalls; the child is not reaped before its
            // `Child` is waited for or dropped, so the pid is still ours.
            unsafe {
                libc::kill(-self.pid, libc::SIGKILL);
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
    }
}

/// The end of what a process wrote on stderr, escaped.
/// Its last lines (at most three), escaped, joined with " | ".
pub(super) fn tail_text(tail: &Mutex<Vec<u8>>) -> String {
    let t = tail.lock().expect("tail");
    let lines: Vec<String> = t
        .split(|&b| b == b'\n')
        .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
        .map(|l| escape_line(l).trim().to_owned())
        .collect();
    lines[lines.len().saturating_sub(3)..].join(" | ")
}

/// A process's stdout or stderr, read into the worker's log line by line,
/// each line tagged with its process and, when it runs exactly one job
/// (or ran one alone last), that job.
///
/// Its own task reads it as bytes arrive, and the process's watcher reads
/// it too before it lets a job go ([`Proc::catch_up_output`]): a job's
/// lines and its answer come on different pipes, and what it printed
/// before answering is in the pipe when the answer is read, so it is
/// logged with that job, not with the next job given at once.
pub(super) struct Output {
    pipe: tokio::net::unix::pipe::Receiver,
    name: &'static str,
    label: Arc<str>,
    index: usize,
    tag: Arc<Mutex<Option<std::sync::Weak<Proc>>>>,
    /// Where stderr's last lines are kept for error messages.
    tail: Option<Arc<Mutex<Vec<u8>>>>,
    /// The line being read, and whether the pipe has closed.
    line: Mutex<Partial>,
}

#[derive(Default)]
struct Partial {
    bytes: Vec<u8>,
    /// Bytes past [`OUTPUT_LINE_MAX`], dropped.
    cut: usize,
    closed: bool,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Output")
            .field("name", &self.name)
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl Output {
    /// Read as bytes arrive until the pipe closes (the process and its
    /// descendants are gone).
    async fn run(self: Arc<Self>) {
        while self.pipe.readable().await.is_ok() {
            if !self.read_now() {
                return;
            }
        }
    }

    /// Read what the pipe holds now and log each whole line; at its end,
    /// the last partial line too. `false` once the pipe has closed.
    pub(super) fn read_now(&self) -> bool {
        let mut line = self.line.lock().expect("output line");
        if line.closed {
            return false;
        }
        let mut buf = [0u8; 8192];
        loop {
            match self.pipe.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.take(&mut line, &buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        if !line.bytes.is_empty() || line.cut > 0 {
            self.log(&mut line);
        }
        line.closed = true;
        false
    }

    /// Add `bytes` to the line being read, logging each line they end.
    fn take(&self, line: &mut Partial, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (upto, ends) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (i, true),
                None => (bytes.len(), false),
            };
            let room = OUTPUT_LINE_MAX.saturating_sub(line.bytes.len());
            line.bytes.extend_from_slice(&bytes[..upto.min(room)]);
            line.cut += upto.saturating_sub(room);
            bytes = &bytes[upto + usize::from(ends)..];
            if ends {
                self.log(line);
            }
        }
    }

    /// Log one line (escaped, with a note of what was cut), and keep it in
    /// stderr's tail.
    fn log(&self, line: &mut Partial) {
        if let Some(tail) = &self.tail {
            let mut t = tail.lock().expect("tail");
            t.extend_from_slice(&line.bytes);
            t.push(b'\n');
            if t.len() > STDERR_TAIL {
                let drop = t.len() - STDERR_TAIL;
                t.drain(..drop);
            }
        }
        let text = escape_line(&line.bytes);
        let note = if line.cut > 0 {
            format!("…[cut {} bytes]", line.cut)
        } else {
            String::new()
        };
        line.bytes.clear();
        line.cut = 0;
        let job = self
            .tag
            .lock()
            .expect("tag")
            .as_ref()
            .and_then(|w| w.upgrade())
            .and_then(|p| p.only_job());
        let (label, index, name) = (&self.label, self.index, self.name);
        match job {
            Some((id, task)) => tracing::info!(
                target: LOG_TARGET,
                handler = %label,
                process = index,
                stream = name,
                job = id,
                task = %escape_line(task.as_bytes()),
                "{text}{note}"
            ),
            None => tracing::info!(
                target: LOG_TARGET,
                handler = %label,
                process = index,
                stream = name,
                "{text}{note}"
            ),
        }
    }
}

/// Read a process's hello within `within`: its version, tasks, inflight
/// and what it wants in job messages (`protocol::WANTS_*`). `Err`: why it
/// did not come.
pub(super) async fn hello(
    started: &mut Started,
    within: std::time::Duration,
) -> Result<(u64, Vec<String>, usize, u8), String> {
    let first = tokio::time::timeout(within, async {
        tokio::select! {
            line = started.lines.recv() => Ok(line),
            status = started.child.wait() => Err(status),
        }
    })
    .await;
    let line = match first {
        Err(_) => {
            return Err(format!(
                "no hello within {} (--process-start-timeout)",
                humantime::format_duration(within)
            ))
        }
        Ok(Err(status)) => return Err(started.exited_early(status).await),
        Ok(Ok(None)) | Ok(Ok(Some(Err(ReadError::Closed)))) => {
            // Closed fd 4, most often by exiting: its exit says why.
            return match tokio::time::timeout(
                std::time::Duration::from_secs(2),
                started.child.wait(),
            )
            .await
            {
                Ok(status) => Err(started.exited_early(status).await),
                Err(_) => Err(format!(
                    "closed fd {PROCESS_OUT_FD} before its hello (does it write its messages to the descriptor in PGWAKE_PROTOCOL_OUT?)"
                )),
            };
        }
        Ok(Ok(Some(Err(ReadError::TooLong(max))))) => {
            return Err(format!("its first line is longer than {max} bytes"))
        }
        Ok(Ok(Some(Err(ReadError::Io(e))))) => {
            return Err(format!("reading its hello failed: {e}"))
        }
        Ok(Ok(Some(Ok(line)))) => line,
    };
    match protocol::parse(&line)? {
        Incoming::Hello {
            version,
            tasks,
            inflight,
            wants,
        } => Ok((version, tasks, inflight, wants)),
        other => Err(format!(
            "its first message is not a hello but {:?}",
            format!("{other:?}").split([' ', '{']).next().unwrap_or("")
        )),
    }
}

/// "exit status 1", "killed by signal 9".
pub(super) fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "ended".into(),
    }
}
