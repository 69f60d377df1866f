//! The processes of one persistent command: started and handshaken,
//! fed jobs within each one's in-flight limit, watched (pings, memory,
//! exits), restarted with backoff, recycled, and stopped.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::process::Child;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::process::{self, Event, Gone, InFlight, Kill, Proc, Reply, Spec, LOG_TARGET};
use super::protocol::{self, Incoming, ReadError, PROTOCOL_VERSION};
use super::Options;
use crate::handlers::exec::escape_line;
use crate::metrics as m;

/// First restart delay after a crash; doubles per crash in a row.
const RESTART_MIN: Duration = Duration::from_millis(100);
/// Longest restart delay.
const RESTART_MAX: Duration = Duration::from_secs(30);
/// How long a process that closed its fd 4 has to exit before it is
/// killed.
const EXIT_AFTER_CLOSE: Duration = Duration::from_secs(2);
/// A process that lived this long before it ended resets the backoff.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// One slot of the pool: the process serving it, if any.
#[derive(Default)]
struct Slot {
    proc: Option<Arc<Proc>>,
    /// Bumped when the slot gets a new process: an old one that ends
    /// afterwards (recycled) does not restart the slot.
    generation: u64,
    /// Crashes in a row (the backoff).
    failures: u32,
}

/// The processes of one command.
pub(super) struct Pool {
    pub(super) spec: Spec,
    pub(super) opts: Options,
    slots: Mutex<Vec<Slot>>,
    /// A process became ready or a job left one.
    changed: Notify,
    started: tokio::sync::OnceCell<Result<Vec<String>, String>>,
    pub(super) stop: CancellationToken,
    token_prefix: u64,
    tokens: AtomicU64,
    /// Jobs waiting to run alone (`isolating`).
    isolating: std::sync::atomic::AtomicIsize,
    /// Restarts so far, of every cause (as `pgwake_persistent_restarts_total`).
    restarts: AtomicU64,
    /// Jobs in [`Pool::dispatch`] that found no process with room and wait
    /// for one (the registry and `pgwake explain` show them).
    waiting: AtomicUsize,
    /// What the processes' hellos asked their job messages to carry
    /// (`protocol::WANTS_*`, or-ed).
    wants: std::sync::atomic::AtomicU8,
}

/// The pool as the worker registry shows it (`Handler::processes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub(super) live: usize,
    pub(super) in_flight: usize,
    pub(super) capacity: usize,
    pub(super) restarts: u64,
    pub(super) waiting: usize,
}

/// Counts a job of [`Pool::dispatch`] waiting for a process with room,
/// until it gets one or its handler is dropped (cancel, timeout, stop).
struct Waiting<'a>(&'a Pool);

impl<'a> Waiting<'a> {
    fn new(pool: &'a Pool) -> Waiting<'a> {
        pool.waiting.fetch_add(1, Ordering::AcqRel);
        Waiting(pool)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("command", &self.spec.label)
            .finish_non_exhaustive()
    }
}

/// Why a start-up failed: configuration (exit 2) or anything else.
pub(super) type StartError = String;

impl Pool {
    pub(super) fn new(spec: Spec, opts: Options) -> Arc<Pool> {
        Arc::new(Pool {
            spec,
            opts,
            slots: Mutex::new(Vec::new()),
            changed: Notify::new(),
            started: tokio::sync::OnceCell::new(),
            stop: CancellationToken::new(),
            token_prefix: rand::random(),
            tokens: AtomicU64::new(0),
            isolating: std::sync::atomic::AtomicIsize::new(0),
            restarts: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            wants: Default::default(),
        })
    }

    /// Start every process and read its hello, once; later calls return the
    /// first one's result. `Ok`: the tasks the processes serve.
    pub(super) async fn ensure_started(self: &Arc<Self>) -> Result<Vec<String>, StartError> {
        let me = self.clone();
        self.started
            .get_or_init(|| async move { me.start_all().await })
            .await
            .clone()
    }

    async fn start_all(self: &Arc<Self>) -> Result<Vec<String>, StartError> {
        let n = self.opts.processes.max(1);
        {
            let mut slots = self.slots.lock().expect("slots");
            slots.clear();
            slots.resize_with(n, Slot::default);
        }
        let launches = (0..n).map(|i| self.launch(i, 0));
        let results = futures::future::join_all(launches).await;
        let mut tasks = None;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(t) => {
                    tasks.get_or_insert(t);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            self.stop.cancel();
            self.kill_all("another process of the pool failed to start");
            return Err(e);
        }
        tracing::info!(
            target: LOG_TARGET,
            handler = %self.spec.label,
            processes = n,
            "persistent handler processes ready"
        );
        Ok(tasks.unwrap_or_default())
    }

    /// Start the process of slot `index` and read its hello; on success it
    /// serves the slot and is watched by its own task. `Ok`: its tasks.
    async fn launch(
        self: &Arc<Self>,
        index: usize,
        generation: u64,
    ) -> Result<Vec<String>, String> {
        let label = self.spec.label.clone();
        let fail = |why: String| format!("persistent handler {label:?}, process {index}: {why}");
        let mut started = process::start(&self.spec, index)
            .map_err(|e| fail(format!("cannot start {}: {e}", self.spec.program.display())))?;
        let (version, tasks, inflight, wants) =
            match process::hello(&mut started, self.opts.start_timeout).await {
                Ok(h) => h,
                Err(why) => {
                    let _ = started.child.start_kill();
                    return Err(fail(why));
                }
            };
        if version != PROTOCOL_VERSION {
            let _ = started.child.start_kill();
            return Err(fail(format!(
                "speaks protocol version {version}, and this pgwake speaks version {PROTOCOL_VERSION}; \
                 upgrade the handler's library or pgwake so that both speak one version"
            )));
        }
        self.wants.fetch_or(wants, Ordering::AcqRel);
        let welcome = protocol::welcome(index, self.opts.ping_interval.as_millis());
        let (proc, child, lines) = started.into_proc(index, inflight, tasks.clone());
        proc.send(welcome);
        let keep = {
            let mut slots = self.slots.lock().expect("slots");
            let slot = &mut slots[index];
            let keep = slot.generation == generation && !self.stop.is_cancelled();
            if keep {
                slot.proc = Some(proc.clone());
            }
            keep
        };
        if !keep {
            proc.kill(Kill::Stopping, "the pool is stopping");
        }
        self.publish();
        self.changed.notify_waiters();
        tokio::spawn(self.clone().watch(proc, child, lines, generation));
        Ok(tasks)
    }

    /// Kill every process (start-up failed, or the stop's grace is over).
    fn kill_all(&self, cause: &str) {
        let slots = self.slots.lock().expect("slots");
        for s in slots.iter() {
            if let Some(p) = &s.proc {
                p.kill(Kill::Stopping, cause);
            }
        }
    }

    /// A job starts (`1`) or stops (`-1`) waiting to run alone: while any
    /// waits, no process takes other new jobs, so one soon has nothing in
    /// flight.
    pub(super) fn isolating(&self, delta: isize) {
        self.isolating.fetch_add(delta, Ordering::AcqRel);
        self.changed.notify_waiters();
    }

    /// A fresh token for a job message.
    fn token(&self) -> String {
        format!(
            "{:016x}{:x}",
            self.token_prefix,
            self.tokens.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// Give `line` (a job message built with `token`) to a process with room,
    /// waiting for one. `isolate`: only to a process with nothing in flight,
    /// which then takes nothing else until this job ends.
    pub(super) async fn dispatch(
        self: &Arc<Self>,
        id: i64,
        task: &str,
        isolate: bool,
        line: impl Fn(&str) -> String,
    ) -> (Arc<Proc>, String, mpsc::UnboundedReceiver<Reply>) {
        let mut waiting = None;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let chosen = {
                let slots = self.slots.lock().expect("slots");
                // The least loaded live process with room.
                slots
                    .iter()
                    .filter_map(|s| s.proc.as_ref())
                    .filter(|p| p.serves(task) && p.has_room(isolate))
                    .filter(|_| isolate || self.isolating.load(Ordering::Acquire) == 0)
                    .min_by_key(|p| p.load())
                    .cloned()
            };
            if let Some(proc) = chosen {
                let token = self.token();
                let (tx, rx) = mpsc::unbounded_channel();
                {
                    let mut inflight = proc.inflight.lock().expect("inflight");
                    // Re-checked under the lock: another dispatch may have
                    // taken the last room.
                    let room = if isolate {
                        inflight.is_empty()
                    } else {
                        inflight.len() < proc.capacity
                    };
                    if !room || proc.closed.load(Ordering::Acquire) {
                        continue;
                    }
                    inflight.insert(
                        id,
                        InFlight {
                            token: token.clone(),
                            task: task.to_owned(),
                            replies: tx,
                            cancelled: false,
                        },
                    );
                    if isolate {
                        proc.isolated.store(true, Ordering::Release);
                    }
                    let alone = inflight.len() == 1;
                    if alone {
                        // The stderr an error message quotes is what the
                        // process wrote since it last became busy.
                        proc.stderr_tail.lock().expect("tail").clear();
                    }
                    *proc.alone.lock().expect("alone") = alone.then(|| (id, task.to_owned()));
                    // Sent under the lock: a drain (sent under it too) is
                    // never queued ahead of a job given before it.
                    proc.send(line(&token));
                }
                self.publish();
                let given = proc.given.fetch_add(1, Ordering::AcqRel) + 1;
                if self
                    .opts
                    .max_jobs_per_process
                    .is_some_and(|max| given >= max)
                {
                    self.recycle(
                        &proc,
                        &format!("served {given} jobs (--max-jobs-per-process)"),
                    );
                }
                return (proc, token, rx);
            }
            waiting.get_or_insert_with(|| Waiting::new(self));
            notified.await;
        }
    }

    /// A job left `proc` (answered, or its process gone): free its room.
    pub(super) fn left(&self, proc: &Proc) {
        proc.isolated.store(false, Ordering::Release);
        self.publish();
        self.changed.notify_waiters();
    }

    /// Count a restart of `cause` (a `pgwake_persistent_restarts_total`
    /// label).
    fn restarted(&self, cause: &'static str) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(m::PERSISTENT_RESTARTS, "handler" => self.spec.label.to_string(), "cause" => cause)
            .increment(1);
    }

    /// Set the gauges of live processes and jobs in flight.
    fn publish(&self) {
        let (live, inflight) = self.load();
        let handler = self.spec.label.to_string();
        metrics::gauge!(m::PERSISTENT_PROCESSES, "handler" => handler.clone()).set(live as f64);
        metrics::gauge!(m::PERSISTENT_IN_FLIGHT, "handler" => handler).set(inflight as f64);
    }

    /// Stop `proc` taking jobs, ask it to drain, and start its replacement.
    fn recycle(self: &Arc<Self>, proc: &Arc<Proc>, why: &str) {
        {
            // Closed and drained under the lock a dispatch gives jobs
            // under: no job is given after the drain.
            let _inflight = proc.inflight.lock().expect("inflight");
            if proc.closed.swap(true, Ordering::AcqRel) {
                return;
            }
            proc.send(protocol::drain());
        }
        tracing::info!(
            target: LOG_TARGET,
            handler = %self.spec.label,
            process = proc.index,
            pid = proc.pid,
            "recycling the process: it {why}; it finishes its jobs while a new one starts"
        );
        self.restarted("recycled");
        let generation = {
            let mut slots = self.slots.lock().expect("slots");
            let slot = &mut slots[proc.index];
            slot.generation += 1;
            slot.proc = None;
            slot.generation
        };
        self.publish();
        let me = self.clone();
        let index = proc.index;
        tokio::spawn(async move { me.restart(index, generation, Duration::ZERO).await });
    }

    /// Start slot `index` again after `delay`, retrying with backoff until
    /// it starts or the pool stops.
    /// (Boxed: it starts a process whose watcher may call it again.)
    fn restart(
        self: Arc<Self>,
        index: usize,
        generation: u64,
        mut delay: Duration,
    ) -> futures::future::BoxFuture<'static, ()> {
        Box::pin(async move {
            loop {
                tokio::select! {
                    _ = self.stop.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                match self.launch(index, generation).await {
                    Ok(_) => return,
                    Err(e) => {
                        let failures = {
                            let mut slots = self.slots.lock().expect("slots");
                            let slot = &mut slots[index];
                            if slot.generation != generation {
                                return;
                            }
                            slot.failures += 1;
                            slot.failures
                        };
                        self.restarted("start_failed");
                        delay = backoff(failures);
                        tracing::error!(
                            target: LOG_TARGET,
                            "{e}; trying again in {}",
                            humantime::format_duration(delay)
                        );
                    }
                }
            }
        })
    }

    /// Watch a process until it ends: route its messages, ping it when
    /// silent, kill it when it stops answering or breaks the protocol,
    /// recycle it when it grows too large; then hand its jobs back and
    /// restart its slot.
    async fn watch(
        self: Arc<Self>,
        proc: Arc<Proc>,
        mut child: Child,
        mut lines: process::Lines,
        generation: u64,
    ) {
        let tick_every =
            (self.opts.ping_interval / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let mut tick = tokio::time::interval(tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ping_seq = 0u64;
        let mut pinged_at: Option<Instant> = None;
        let mut lines_open = true;
        let mut empty_since: Option<Instant> = None;
        let status = loop {
            tokio::select! {
                status = child.wait() => break status,
                line = lines.recv(), if lines_open => match line {
                    Some(Ok(bytes)) => {
                        *proc.heard.lock().expect("heard") = Instant::now();
                        pinged_at = None;
                        if let Err(Event::ProtocolError(why)) = self.route(&proc, &bytes) {
                            self.protocol_error(&proc, &why);
                        }
                    }
                    Some(Err(ReadError::TooLong(max))) => {
                        lines_open = false;
                        self.protocol_error(&proc, &format!("wrote a line longer than {max} bytes (--protocol-line-max)"));
                    }
                    Some(Err(ReadError::Io(e))) => {
                        lines_open = false;
                        self.protocol_error(&proc, &format!("reading its messages failed: {e}"));
                    }
                    Some(Err(ReadError::Closed)) | None => {
                        lines_open = false;
                        // It closed fd 4, most often because it is exiting:
                        // its exit tells why. One that lives on can no
                        // longer be heard, so it must go.
                        match tokio::time::timeout(EXIT_AFTER_CLOSE, child.wait()).await {
                            Ok(status) => break status,
                            Err(_) => proc.kill(Kill::Other, &format!(
                                "closed its protocol descriptor (fd {}) and went on running",
                                protocol::PROCESS_OUT_FD
                            )),
                        }
                    }
                },
                _ = tick.tick() => {
                    let silent = proc.heard.lock().expect("heard").elapsed();
                    if silent >= self.opts.process_timeout {
                        proc.kill(Kill::Unresponsive, &format!(
                            "answered nothing for {} (no pong to pings; --process-timeout)",
                            humantime::format_duration(Duration::from_secs(silent.as_secs()))
                        ));
                    } else if silent >= self.opts.ping_interval
                        && pinged_at.is_none_or(|at| at.elapsed() >= self.opts.ping_interval)
                    {
                        ping_seq += 1;
                        proc.send(protocol::ping(ping_seq));
                        pinged_at = Some(Instant::now());
                    }
                    if let Some(max) = self.opts.max_memory {
                        if let Some(rss) = proc.rss() {
                            if rss > max {
                                self.recycle(&proc, &format!(
                                    "uses {} MiB resident, above --max-process-memory {} MiB",
                                    rss / (1024 * 1024),
                                    max / (1024 * 1024)
                                ));
                            }
                        }
                    }
                    // Drained (recycled or stopping) and empty: it should
                    // exit by itself; past the grace it is killed.
                    if proc.closed.load(Ordering::Acquire) && proc.load() == 0 {
                        let since = *empty_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= self.opts.cancel_grace {
                            proc.kill(Kill::Other, "did not exit after its drain (--cancel-grace)");
                        }
                    } else {
                        empty_since = None;
                    }
                }
            }
        };
        // What it wrote before it exited still counts (an answer, then its
        // exit after a drain): read the rest, for a moment at most (a
        // descendant may hold the pipe open).
        if lines_open {
            let rest = async {
                while let Some(Ok(bytes)) = lines.recv().await {
                    if let Err(Event::ProtocolError(why)) = self.route(&proc, &bytes) {
                        self.protocol_error(&proc, &why);
                    }
                }
            };
            let _ = tokio::time::timeout(EXIT_AFTER_CLOSE, rest).await;
        }
        self.ended(proc, status, generation).await;
    }

    /// Route one line of `proc`. `Err`: a protocol error.
    fn route(&self, proc: &Proc, line: &[u8]) -> Result<(), Event> {
        let msg = protocol::parse(line).map_err(Event::ProtocolError)?;
        let (id, token) = match msg.job() {
            Some((id, token)) => (id, token.to_owned()),
            None => {
                return match msg {
                    Incoming::Pong { .. } => Ok(()),
                    Incoming::Hello { .. } => {
                        Err(Event::ProtocolError("sent a second hello".into()))
                    }
                    _ => Ok(()),
                }
            }
        };
        if matches!(
            msg,
            Incoming::Done { .. } | Incoming::Fail { .. } | Incoming::Snooze { .. }
        ) && proc.load() == 1
        {
            // What the job printed before it answered is its own: logged
            // with its tag before the next job takes the process.
            proc.catch_up_output();
        }
        let mut inflight = proc.inflight.lock().expect("inflight");
        let Some(entry) = inflight.get(&id) else {
            drop(inflight);
            let answered = proc.answered.lock().expect("answered");
            return if answered.iter().any(|(i, t)| *i == id && *t == token) {
                Err(Event::ProtocolError(format!("answered job {id} twice")))
            } else if answered.iter().any(|(i, _)| *i == id) {
                self.stale(proc, id);
                Ok(())
            } else {
                Err(Event::ProtocolError(format!(
                    "answered job {id}, which was never given to it"
                )))
            };
        };
        if entry.token != token {
            drop(inflight);
            self.stale(proc, id);
            return Ok(());
        }
        match msg {
            Incoming::Sql {
                seq, sql, params, ..
            } => {
                if entry.cancelled {
                    proc.send(protocol::sql_error(
                        id,
                        &token,
                        seq,
                        "the job was cancelled",
                        None,
                    ));
                } else {
                    let _ = entry.replies.send(Reply::Sql { seq, sql, params });
                }
            }
            // A cancelled job's reports are dropped.
            Incoming::Progress { value, message, .. } if !entry.cancelled => {
                let _ = entry.replies.send(Reply::Progress { value, message });
            }
            Incoming::Step { name, output, .. } => {
                if entry.cancelled {
                    proc.send(protocol::step_recorded(
                        id,
                        &token,
                        &name,
                        Some("the job was cancelled: the step is not recorded"),
                    ));
                } else {
                    let _ = entry.replies.send(Reply::Step { name, output });
                }
            }
            Incoming::Done { result, .. } => {
                let entry = inflight.remove(&id).expect("entry");
                drop(inflight);
                proc.remember(id, token);
                if !entry.cancelled {
                    let _ = entry.replies.send(Reply::Done(result));
                }
                self.left(proc);
            }
            Incoming::Snooze { after, .. } => {
                let entry = inflight.remove(&id).expect("entry");
                drop(inflight);
                proc.remember(id, token);
                if !entry.cancelled {
                    let _ = entry.replies.send(Reply::Snooze(after));
                }
                self.left(proc);
            }
            Incoming::Fail {
                error,
                for_good,
                retry_after,
                ..
            } => {
                let entry = inflight.remove(&id).expect("entry");
                drop(inflight);
                proc.remember(id, token);
                if !entry.cancelled {
                    let _ = entry.replies.send(Reply::Fail {
                        error,
                        for_good,
                        retry_after,
                    });
                }
                self.left(proc);
            }
            _ => {}
        }
        Ok(())
    }

    fn stale(&self, proc: &Proc, id: i64) {
        metrics::counter!(m::PERSISTENT_PROTOCOL_ERRORS, "handler" => self.spec.label.to_string(), "kind" => "stale_token")
            .increment(1);
        tracing::warn!(
            target: LOG_TARGET,
            handler = %self.spec.label,
            process = proc.index,
            job = id,
            "refused a reply with a stale token for job {id} (an answer to an earlier delivery of it): ignored"
        );
    }

    fn protocol_error(&self, proc: &Proc, why: &str) {
        metrics::counter!(m::PERSISTENT_PROTOCOL_ERRORS, "handler" => self.spec.label.to_string(), "kind" => "fatal")
            .increment(1);
        let tasks: Vec<String> = proc
            .inflight
            .lock()
            .expect("inflight")
            .values()
            .map(|f| escape_line(f.task.as_bytes()))
            .collect();
        tracing::error!(
            target: LOG_TARGET,
            handler = %self.spec.label,
            process = proc.index,
            pid = proc.pid,
            tasks = ?tasks,
            "protocol error: the process {why}; replacing it (its jobs go back to run again)"
        );
        proc.kill(Kill::Protocol, &format!("broke the protocol: it {why}"));
    }

    /// `proc` ended: tell its jobs, count it, restart its slot.
    async fn ended(
        self: Arc<Self>,
        proc: Arc<Proc>,
        status: std::io::Result<std::process::ExitStatus>,
        generation: u64,
    ) {
        proc.closed.store(true, Ordering::Release);
        // Whatever its group still holds goes too.
        // SAFETY: plain syscall on the group the process led.
        unsafe {
            libc::kill(-proc.pid, libc::SIGKILL);
        }
        let killed = proc.kill_cause.lock().expect("kill cause").clone();
        let status_text = match &status {
            Ok(s) => process::describe_status(*s),
            Err(e) => format!("could not be waited for ({e})"),
        };
        let cause = match &killed {
            Some((_, why)) => format!("was killed: it {why}"),
            None => {
                let tail = process::tail_text(&proc.stderr_tail);
                if tail.is_empty() {
                    format!("exited ({status_text})")
                } else {
                    format!("exited ({status_text}); stderr: {tail}")
                }
            }
        };
        // Who is to blame: a job alone in flight when its process crashed
        // or stopped answering. A kill for a cancel not honoured blames
        // none of the others.
        let blame = killed.as_ref().is_none_or(|(kind, _)| kind.blames());
        let jobs: Vec<(i64, InFlight)> = proc.inflight.lock().expect("inflight").drain().collect();
        let live: Vec<&(i64, InFlight)> = jobs.iter().filter(|(_, f)| !f.cancelled).collect();
        let culprit = blame && live.len() == 1;
        let draining = proc.closed.load(Ordering::Acquire) && killed.is_none();
        if !jobs.is_empty() || !draining || !status.as_ref().is_ok_and(|s| s.success()) {
            let ids: Vec<i64> = live.iter().map(|(id, _)| *id).collect();
            let level_error = !live.is_empty() || killed.is_some();
            if level_error {
                tracing::warn!(
                    target: LOG_TARGET,
                    handler = %self.spec.label,
                    process = proc.index,
                    pid = proc.pid,
                    jobs = ?ids,
                    "the process {cause}{}",
                    match live.len() {
                        0 => String::new(),
                        1 => format!("; job {} counts it as a failed attempt", ids[0]),
                        n => format!("; its {n} jobs run again, each alone, uncharged"),
                    }
                );
            } else {
                tracing::info!(
                    target: LOG_TARGET,
                    handler = %self.spec.label,
                    process = proc.index,
                    "the process {cause}"
                );
            }
        }
        for (id, f) in jobs {
            proc.remember(id, f.token.clone());
            if !f.cancelled {
                let _ = f.replies.send(Reply::Gone(Gone {
                    cause: cause.clone(),
                    culprit,
                }));
            }
        }
        proc.isolated.store(false, Ordering::Release);
        // Restart the slot, unless it already has its next process
        // (recycled) or the pool stops.
        let restart = {
            let mut slots = self.slots.lock().expect("slots");
            let slot = &mut slots[proc.index];
            if slot.generation == generation && !self.stop.is_cancelled() {
                slot.generation += 1;
                slot.proc = None;
                if proc.started.elapsed() >= STABLE_AFTER && !culprit {
                    slot.failures = 0;
                } else {
                    slot.failures += 1;
                }
                Some((slot.generation, backoff(slot.failures)))
            } else {
                None
            }
        };
        self.publish();
        self.changed.notify_waiters();
        if let Some((generation, delay)) = restart {
            let label_cause = killed.as_ref().map_or("exited", |(kind, _)| kind.label());
            self.restarted(label_cause);
            tracing::info!(
                target: LOG_TARGET,
                handler = %self.spec.label,
                process = proc.index,
                "restarting process {} in {}",
                proc.index,
                humantime::format_duration(delay)
            );
            self.restart(proc.index, generation, delay).await;
        }
    }

    /// Stop every process: drain them (each finishes its jobs and exits),
    /// killing what is left after `grace`.
    pub(super) async fn shutdown(&self, grace: Duration) {
        self.stop.cancel();
        let procs: Vec<Arc<Proc>> = {
            let slots = self.slots.lock().expect("slots");
            slots.iter().filter_map(|s| s.proc.clone()).collect()
        };
        for p in &procs {
            let _inflight = p.inflight.lock().expect("inflight");
            if !p.closed.swap(true, Ordering::AcqRel) {
                p.send(protocol::drain());
            }
        }
        let deadline = Instant::now() + grace;
        for p in &procs {
            while process_alive(p.pid) && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if process_alive(p.pid) {
                p.kill(
                    Kill::Stopping,
                    "the pool is stopping and it did not exit after its drain",
                );
            }
        }
    }

    /// What the hellos so far asked job messages to carry
    /// (`protocol::WANTS_*`).
    pub(super) fn wants(&self) -> u8 {
        self.wants.load(Ordering::Acquire)
    }

    /// The number of live processes and the jobs in flight on them.
    pub(super) fn load(&self) -> (usize, usize) {
        let slots = self.slots.lock().expect("slots");
        let live: Vec<&Arc<Proc>> = slots.iter().filter_map(|s| s.proc.as_ref()).collect();
        (live.len(), live.iter().map(|p| p.load()).sum())
    }

    /// Live processes, their jobs in flight and room (the sum of their
    /// hellos' `inflight`), restarts so far, and jobs waiting for room.
    pub(super) fn snapshot(&self) -> Snapshot {
        let slots = self.slots.lock().expect("slots");
        let live: Vec<&Arc<Proc>> = slots.iter().filter_map(|s| s.proc.as_ref()).collect();
        Snapshot {
            live: live.len(),
            in_flight: live.iter().map(|p| p.load()).sum(),
            capacity: live.iter().map(|p| p.capacity).sum(),
            restarts: self.restarts.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Acquire),
        }
    }

    /// Mark `id`'s delivery `token` on `proc` cancelled and ask the process
    /// to stop it; kill the process if it does not answer within the
    /// grace period.
    pub(super) fn cancel(self: &Arc<Self>, proc: &Arc<Proc>, id: i64, token: &str, reason: &str) {
        {
            let mut inflight = proc.inflight.lock().expect("inflight");
            match inflight.get_mut(&id) {
                Some(f) if f.token == token => f.cancelled = true,
                _ => return,
            }
        }
        proc.send(protocol::cancel(id, token, reason));
        let grace = self.opts.cancel_grace;
        let proc = proc.clone();
        let token = token.to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(grace).await;
            let still = proc
                .inflight
                .lock()
                .expect("inflight")
                .get(&id)
                .is_some_and(|f| f.token == token);
            if still {
                proc.kill(
                    Kill::CancelGrace,
                    &format!(
                        "did not stop job {id} within {} of its cancel (--cancel-grace)",
                        humantime::format_duration(grace)
                    ),
                );
            }
        });
    }
}

/// Whether `pid` still exists (not yet reaped counts).
fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks.
    unsafe { libc::kill(pid, 0) == 0 }
}

/// The restart delay after `failures` crashes in a row.
fn backoff(failures: u32) -> Duration {
    if failures == 0 {
        return Duration::ZERO;
    }
    RESTART_MIN
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(RESTART_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restarts_back_off_to_a_cap() {
        assert_eq!(backoff(0), Duration::ZERO);
        assert_eq!(backoff(1), Duration::from_millis(100));
        assert_eq!(backoff(2), Duration::from_millis(200));
        assert_eq!(backoff(20), RESTART_MAX);
    }
}
