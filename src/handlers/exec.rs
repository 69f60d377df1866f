//! `exec` handler: one process per job.
//!
//! The command is split like a POSIX shell splits words (quotes and
//! backslashes work) but is **not** run by a shell: no globbing, pipes or
//! variable expansion. Use `exec:sh -c '…'` when you want a shell.
//!
//! Runs in `lease` mode: no connection is held and no transaction stays
//! open while the command runs (a claim queue can override this with
//! `--tx-queues`).
//!
//! The payload is written to the process's stdin exactly as PostgreSQL
//! stores it (`payload::text`: numbers keep every digit); `PGWAKE_JOB_ID`,
//! `PGWAKE_TASK`, `PGWAKE_QUEUE` and `PGWAKE_ATTEMPT` are in its environment,
//! which is explicit: a few inherited variables, the names given to
//! `--exec-env` and `PGWAKE_EXEC_*`, never the worker's `DATABASE_URL` or
//! `PGPASSWORD` (see `explicit_env` and [`check_passed_env`]).
//! A job with recorded steps gets [`STEPS_VAR`], one with parents
//! [`PARENT_RESULTS_VAR`]: paths of files in a private directory made for
//! the run (`RunFiles`), read in one statement before the command starts;
//! a `pgwake-step:` stderr line ([`STEP_LINE`]) records a step as
//! [`JobContext::step`] does, and a refused one fails the attempt.
//! Exit status 0 is success; [`EXIT_FAIL`] (65) fails the job for good;
//! [`EXIT_RETRY_LATER`] (75) retries it after the delay of a
//! `pgwake-retry-after:` stderr line, or snoozes it (no attempt used) for
//! the delay of a `pgwake-snooze:` line; anything else is a failed attempt,
//! retried with backoff. On failure the stderr tail becomes `last_error`;
//! every stderr line also goes to the worker's log, tagged with the job and
//! escaped, within bounds ([`STDERR_LOG_LINE_MAX`],
//! [`STDERR_LOG_LINES_MAX`]). stdout, up to [`EXEC_STDOUT_MAX_DEFAULT`]
//! bytes (`--exec-stdout-max`), is the job's result (recorded when history
//! is on) and never reaches the worker's own stdout: JSON output is kept as
//! JSON, any other text as a JSON string, output past the bound is cut (and
//! then is a string ending in `…[cut]`), empty output is no result.
//!
//! A job's processes end with it. Started through the exec shim
//! ([`EXEC_SHIM_BINARY`], see [`use_exec_shim`] and `shim.rs`), the command
//! runs under a supervisor that is a child subreaper: at the job timeout, on
//! cancel, at a shutdown past its grace period (the worker sends it
//! SIGTERM), when the worker process dies (its death signal, even after
//! `kill -9`) and when the command exits, it kills the command's whole
//! process tree — its process group, and every descendant that left it
//! (`setsid`, a double-forked daemon), found as its children — and exits
//! only once the tree is gone. Without the shim (a program embedding the
//! library that never calls [`use_exec_shim`], or a shim that fails to
//! start) the worker forks the command in a process group of its own with
//! `PR_SET_PDEATHSIG` (a `pre_exec` closure); at the timeout, on cancel and
//! at shutdown it stops and kills the group and every descendant it can
//! still find in `/proc` (`kill_descendants`), but a process whose parent
//! already died (a double-forked daemon, re-parented to init) is lost to it,
//! and a `kill -9` of the worker kills the command alone: use the shim, or
//! run pgwake under systemd or Kubernetes, which kill the whole cgroup.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use async_trait::async_trait;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::error::{Error, Result};
use crate::handler::{BoxError, Delivery, Handler, JobContext};
use crate::job::{Job, Outcome};

mod shim;
mod stderr;

pub use shim::{
    exec_shim, run_if_asked, use_exec_shim, EXEC_SHIM_ARG, EXEC_SHIM_BINARY, EXEC_SHIM_STOP,
    EXIT_CANNOT_START,
};
pub use stderr::{
    escape_line, parse_progress, parse_retry_after, parse_step, LOG_TARGET, PROGRESS_LINE,
    PROGRESS_LINE_MAX, RETRY_AFTER_LINE, SNOOZE_LINE, STDERR_LOG_LINES_MAX, STDERR_LOG_LINE_MAX,
    STDERR_TAIL_BYTES, STEP_LINE, STEP_LINE_MAX,
};

/// Exit status of a command that failed for good (`EX_DATAERR` of
/// `sysexits.h`: "the input data was incorrect"): the job goes to
/// `pgwake.dead_jobs` at once, whatever attempts remain, with the stderr
/// tail as its error ([`Outcome::Fail`]).
pub const EXIT_FAIL: i32 = 65;

/// Exit status of a command asking to be run again later (`EX_TEMPFAIL` of
/// `sysexits.h`, which mail transfer agents read as "defer"): an attempt
/// retried after the delay of its last `pgwake-retry-after:` stderr line
/// ([`RETRY_AFTER_LINE`]), or after the configured backoff without one
/// ([`Outcome::Retry`]: it counts as an attempt). With a `pgwake-snooze:`
/// stderr line ([`SNOOZE_LINE`]), it snoozes instead: back after that
/// delay, no attempt used ([`Outcome::Snooze`]).
pub const EXIT_RETRY_LATER: i32 = 75;

/// Variables of the worker's environment an exec command inherits. Nothing
/// else is passed: the worker's own environment holds `DATABASE_URL`,
/// `PGPASSWORD`, `PGWAKE_LISTEN_DATABASE_URL` and other secrets a job's
/// command has no business reading.
pub const EXEC_ENV_INHERITED: &[&str] = &[
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "TERM",
];
/// Variables named `PGWAKE_EXEC_<NAME>` in the worker's environment reach
/// the command as `<NAME>` (e.g. `PGWAKE_EXEC_API_TOKEN` → `API_TOKEN`).
pub const EXEC_ENV_PREFIX: &str = "PGWAKE_EXEC_";

/// The environment form of `--exec-env`: names separated by commas. Not
/// `PGWAKE_EXEC_ENV`, which already reaches every command as `ENV`.
pub const EXEC_ENV_VAR: &str = "PGWAKE_PASS_ENV";

/// Check the names of `--exec-env` (variables of the worker's environment
/// passed to exec commands unchanged) as [`ExecHandler::with_passed_env`]
/// does, and log a warning for each name the worker's environment does not
/// have (commands will not see it). `pgwake run` calls this once, with or
/// without exec handlers.
pub fn check_passed_env(names: &[String]) -> Result<()> {
    check_names(names)?;
    for name in names {
        if std::env::var_os(name).is_none() {
            tracing::warn!(
                "--exec-env {name}: the worker's environment has no such variable, so exec commands will not see it"
            );
        }
    }
    Ok(())
}

/// Each name must be a variable name, and none may be `DATABASE_URL` or
/// start with `PG` (libpq's `PGPASSWORD`, `PGPASSFILE`, `PGHOST`…, pgwake's
/// own `PGWAKE_*` settings), in any case: those are the worker's database
/// connection and password, which an exec command never sees by accident.
/// A variable of such a name can still be given on purpose as
/// `PGWAKE_EXEC_<NAME>`.
pub(crate) fn check_names(names: &[String]) -> Result<()> {
    let refuse = |name: &str, why: String| {
        Err(Error::Config(format!(
            "--exec-env {name:?} (the flag or {EXEC_ENV_VAR}): {why}"
        )))
    };
    for name in names {
        if name.is_empty() || name.contains(['=', '\0']) {
            return refuse(
                name,
                "not a variable name; give one name per --exec-env, or names separated by commas"
                    .into(),
            );
        }
        let upper = name.to_ascii_uppercase();
        if let Some(renamed) = upper.strip_prefix(EXEC_ENV_PREFIX) {
            return refuse(
                name,
                format!(
                    "refused: every {EXEC_ENV_PREFIX}<NAME> of the worker's environment already reaches commands as <NAME> (here {renamed})"
                ),
            );
        }
        if upper.starts_with("PGWAKE_") {
            return refuse(
                name,
                "refused: PGWAKE_* variables are the worker's own settings (PGWAKE_LISTEN_DATABASE_URL \
                 is a database URL); a command gets its job's PGWAKE_JOB_ID, PGWAKE_TASK, PGWAKE_QUEUE \
                 and PGWAKE_ATTEMPT"
                    .into(),
            );
        }
        if upper == "DATABASE_URL" || upper.starts_with("PG") {
            return refuse(
                name,
                format!(
                    "refused: DATABASE_URL and the PG* variables (PGPASSWORD, PGPASSFILE, PGHOST…) hold \
                     the worker's own database connection and password, which never reach an exec \
                     command by accident; to give a command a variable of this name on purpose, set \
                     {EXEC_ENV_PREFIX}{name} in the worker's environment"
                ),
            );
        }
    }
    Ok(())
}

/// Give `cmd` the explicit, documented environment of an exec command
/// ([`EXEC_ENV_INHERITED`], `LC_*`, the `passed` names of `--exec-env`,
/// `PGWAKE_EXEC_*` with the prefix removed, which wins over a passed
/// variable of the same name) instead of the worker's whole environment.
/// The job's `PGWAKE_*` variables are added by the caller.
pub(crate) fn explicit_env(cmd: &mut std::process::Command, passed: &[String]) {
    cmd.env_clear();
    for (key, value) in std::env::vars_os() {
        let Some(name) = key.to_str() else { continue };
        if EXEC_ENV_INHERITED.contains(&name)
            || name.starts_with("LC_")
            || passed.iter().any(|p| p == name)
        {
            cmd.env(&key, &value);
        }
    }
    for (key, value) in std::env::vars_os() {
        let Some(name) = key.to_str() else { continue };
        if let Some(stripped) = name.strip_prefix(EXEC_ENV_PREFIX) {
            if !stripped.is_empty() {
                cmd.env(stripped, &value);
            }
        }
    }
}

/// How much of a command's stdout is kept as its result, by default
/// (`--exec-stdout-max`; 0 keeps none, and stdout is then discarded).
pub const EXEC_STDOUT_MAX_DEFAULT: usize = 64 * 1024;

/// Largest `--exec-stdout-max`.
pub const EXEC_STDOUT_MAX_LIMIT: usize = 64 * 1024 * 1024;

/// Marker appended to a result cut at the bound.
pub const STDOUT_CUT_MARK: &str = "…[cut]";

/// Runs a command per job.
#[derive(Debug, Clone)]
pub struct ExecHandler {
    program: PathBuf,
    args: Vec<String>,
    stdout_max: usize,
    /// `--exec-env`: variables passed through unchanged.
    passed_env: Vec<String>,
}

/// The variable naming the file of a job's recorded steps, a JSON object by
/// step name (`{"charge": "ch_1", "ship": 42}`): set only when the job has
/// recorded steps. The file is in a directory made for the run (mode
/// 0700, in `TMPDIR` or `/tmp`) and removed when the run ends.
pub const STEPS_VAR: &str = "PGWAKE_STEPS";

/// The variable naming the file of what a job's parents left it,
/// `pgwake.parent_results(id)`'s object by parent id
/// (`{"12": {"result": …}, "13": {"error": "…"}}`): set only for a job that
/// has parents, in the same directory as [`STEPS_VAR`]'s.
pub const PARENT_RESULTS_VAR: &str = "PGWAKE_PARENT_RESULTS";

/// The files a run of a command reads its recorded steps and its parents'
/// results from ([`STEPS_VAR`], [`PARENT_RESULTS_VAR`]): in a directory of
/// their own, created for the run (mode 0700, in `TMPDIR` or `/tmp`) and
/// removed when the run ends however it ends (a worker killed with
/// `kill -9` leaves it behind). Made only for a job that has something to
/// put in them.
struct RunFiles {
    dir: PathBuf,
    steps: Option<PathBuf>,
    parents: Option<PathBuf>,
}

impl RunFiles {
    /// Write `inputs` to files of a new private directory; `None` when
    /// there is nothing to write.
    async fn write(job: &Job, inputs: &crate::steps::Inputs) -> std::io::Result<Option<RunFiles>> {
        if inputs.steps.is_none() && inputs.parents.is_none() {
            return Ok(None);
        }
        let dir = private_dir(job.id)?;
        let mut files = RunFiles {
            dir,
            steps: None,
            parents: None,
        };
        if let Some(text) = &inputs.steps {
            let path = files.dir.join("steps.json");
            tokio::fs::write(&path, text).await?;
            files.steps = Some(path);
        }
        if let Some(text) = &inputs.parents {
            let path = files.dir.join("parent_results.json");
            tokio::fs::write(&path, text).await?;
            files.parents = Some(path);
        }
        Ok(Some(files))
    }
}

impl Drop for RunFiles {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot remove an exec run's directory: {e}");
        }
    }
}

/// A new directory only this user can enter, named for job `id`: created,
/// never reused (an existing name, even a link planted by someone else, is
/// passed over).
fn private_dir(id: i64) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let base = std::env::temp_dir();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut last = None;
    for n in 0..100u32 {
        let dir = base.join(format!(
            "pgwake-job-{id}-{}-{nanos:x}-{n}",
            std::process::id()
        ));
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
}

/// Resolve `program` like `execvp` would, so a typo fails at start-up.
pub(crate) fn resolve(program: &str) -> Option<PathBuf> {
    let is_executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata()
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return is_executable(&p).then_some(p);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| is_executable(p))
}

impl ExecHandler {
    /// Parse `COMMAND [ARGS…]` and check the program exists and is executable.
    pub fn parse(spec: &str) -> Result<ExecHandler> {
        let words = shell_words::split(spec)
            .map_err(|e| Error::Config(format!("exec handler {spec:?}: {e}")))?;
        let (program, args) = words
            .split_first()
            .ok_or_else(|| Error::Config("exec handler: empty command".into()))?;
        let resolved = resolve(program).ok_or_else(|| {
            Error::Config(format!(
                "exec handler: command {program:?} not found or not executable (checked PATH); fix the path or install it"
            ))
        })?;
        Ok(ExecHandler {
            program: resolved,
            args: args.to_vec(),
            stdout_max: EXEC_STDOUT_MAX_DEFAULT,
            passed_env: Vec::new(),
        })
    }

    /// Pass these variables of the worker's environment to the command
    /// unchanged (`--exec-env`), beside the inherited few and
    /// `PGWAKE_EXEC_*`. Each must be a variable name, and none may be
    /// `DATABASE_URL` or start with `PG` (libpq's `PGPASSWORD`,
    /// `PGPASSFILE`, `PGHOST`…, pgwake's own `PGWAKE_*` settings), in any
    /// case: those are the worker's database connection and password, which
    /// a command never sees by accident (`PGWAKE_EXEC_<NAME>` still gives a
    /// command such a variable on purpose).
    pub fn with_passed_env(mut self, names: &[String]) -> Result<ExecHandler> {
        check_names(names)?;
        self.passed_env = names.to_vec();
        Ok(self)
    }

    /// Keep at most `bytes` of stdout as the result (0: keep none; the
    /// command's stdout is then `/dev/null`).
    pub fn with_stdout_max(mut self, bytes: usize) -> ExecHandler {
        self.stdout_max = bytes;
        self
    }

    /// The command of `job`, started through `shim` if given.
    fn command(
        &self,
        job: &Job,
        shim: Option<&Path>,
        trace: Option<&crate::trace::TraceContext>,
        files: Option<&RunFiles>,
    ) -> Command {
        let mut cmd = match shim {
            // `posix_spawn` of the shim, which supervises the command's
            // process tree (see `shim.rs`). Not killed when the job's future
            // is dropped: `TreeGuard` asks it to stop, and it exits once the
            // whole tree is gone.
            Some(shim) => {
                let mut cmd = Command::new(shim);
                cmd.arg(EXEC_SHIM_ARG)
                    .arg(std::process::id().to_string())
                    .arg(&self.program)
                    .kill_on_drop(false);
                cmd
            }
            None => {
                let mut cmd = Command::new(&self.program);
                // If the worker itself dies (kill -9, OOM), take the command
                // with it: the database hands the job to another worker at
                // once, and the first run must not go on beside the second.
                // (A `pre_exec` closure makes the standard library fork the
                // worker: the shim avoids that. What the command started
                // is not covered: see the module's documentation.)
                // SAFETY: prctl is async-signal-safe; nothing else runs in
                // the child.
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                        Ok(())
                    });
                }
                cmd.kill_on_drop(true);
                cmd
            }
        };
        explicit_env(cmd.as_std_mut(), &self.passed_env);
        cmd.args(&self.args)
            .env("PGWAKE_JOB_ID", job.id.to_string())
            .env("PGWAKE_TASK", &job.task)
            .env("PGWAKE_QUEUE", &job.queue)
            .env("PGWAKE_ATTEMPT", job.attempt.to_string())
            .stdin(Stdio::piped())
            .stdout(if self.stdout_max > 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stderr(Stdio::piped())
            .process_group(0);
        if let Some(files) = files {
            if let Some(path) = &files.steps {
                cmd.env(STEPS_VAR, path);
            }
            if let Some(path) = &files.parents {
                cmd.env(PARENT_RESULTS_VAR, path);
            }
        }
        // The run's W3C context (the standard variables OpenTelemetry's
        // environment propagators read), when the worker traces jobs.
        if let Some(t) = trace {
            cmd.env("TRACEPARENT", &t.traceparent);
            if let Some(state) = &t.tracestate {
                cmd.env("TRACESTATE", state);
            }
        }
        cmd
    }
}

/// The result of a command's stdout: JSON kept as JSON, other text as a
/// string, empty output none; `cut` marks output past the bound.
pub fn stdout_result(out: &[u8], cut: bool) -> Option<serde_json::Value> {
    let text = String::from_utf8_lossy(out);
    let trimmed = text.trim();
    if trimmed.is_empty() && !cut {
        return None;
    }
    if !cut {
        if let Ok(value) = serde_json::from_str::<serde_json::Value>(trimmed) {
            return Some(value);
        }
    }
    let mut s = text.trim_end().to_string();
    if cut {
        s.push_str(STDOUT_CUT_MARK);
    }
    Some(serde_json::Value::String(s))
}

/// Read `from` to its end, keeping the first `max` bytes; the rest is
/// counted but not kept. Nothing is written anywhere else: a command's
/// stdout is its result, never the worker's output. Never stops reading
/// early (a command blocked on a full pipe would never exit).
async fn capture(mut from: tokio::process::ChildStdout, max: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = [0u8; 8192];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = max - kept.len();
        if n > room {
            cut = true;
        }
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    (kept, cut)
}

/// Stops the process tree of a command that is still running when the
/// job's future is dropped (timeout, cancel, shutdown). Through the shim:
/// asks the shim to kill the tree ([`EXEC_SHIM_STOP`]), and waits for the
/// shim, which exits once the whole tree is gone. Without it: stops and
/// kills the command's process group and every descendant still linked to
/// it (`kill_descendants`; `kill_on_drop` alone would leave its children,
/// e.g. under `sh -c`, running), and waits for the command. Either way the
/// wait is brief (bounded by [`EXIT_WAIT`]) and does not reap the process
/// (tokio does): a SIGKILL is delivered asynchronously, and the job's
/// outcome (e.g. cancelled, in `dead_jobs`) must not be recorded while its
/// processes still run — on a loaded machine the outcome write could
/// otherwise come first.
struct TreeGuard {
    pid: Option<i32>,
    /// Whether `pid` is the exec shim.
    shim: bool,
}

/// Longest wait in [`TreeGuard`]'s drop for the stopped command (or its
/// shim) to exit (a process in uninterruptible sleep, e.g. on a hung
/// network file system, cannot die at once; the worker must not hang with
/// it).
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Drop for TreeGuard {
    fn drop(&mut self) {
        let Some(pid) = self.pid else {
            return;
        };
        if self.shim {
            // SAFETY: plain syscall to our own, not yet reaped child.
            unsafe {
                libc::kill(pid, EXEC_SHIM_STOP);
            }
        } else {
            kill_descendants(pid);
        }
        if wait_exited(pid, EXIT_WAIT) {
            return;
        }
        if self.shim {
            // A shim still waiting for a process that cannot die yet (or
            // an older shim that `exec`ed the command and met a command
            // ignoring SIGTERM): kill its group, which is the command's
            // for an older one.
            // SAFETY: plain syscall; our own child's group.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        tracing::warn!(
            pid,
            "an exec command killed with SIGKILL has not exited yet"
        );
    }
}

/// Wait (polling, at most `within`) until our child `pid` has exited,
/// without reaping it; true if it did.
fn wait_exited(pid: i32, within: std::time::Duration) -> bool {
    let started = std::time::Instant::now();
    loop {
        // SAFETY: waitid on our own child with WNOWAIT leaves it to be
        // reaped by tokio; `info` is a valid out-parameter.
        let exited = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
            );
            // r < 0: not our child any more (already reaped): gone.
            r < 0 || info.si_pid() != 0
        };
        if exited {
            return true;
        }
        if started.elapsed() >= within {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Kill the process tree of the command `root` (our child, not yet reaped,
/// the leader of its own process group) from outside, as the forking path
/// can: stop (SIGSTOP) its group and every process descended from it,
/// looking again in `/proc` until no new one appears (a stopped process
/// can neither fork nor exit, so none slips away in between), then SIGKILL
/// each with its group. A descendant whose parent had already died before
/// (a double-forked daemon) was re-parented to init and is not found.
fn kill_descendants(root: i32) {
    let mut found = vec![root];
    // SAFETY: plain syscall; `root` is our child's group.
    unsafe {
        libc::kill(-root, libc::SIGSTOP);
    }
    loop {
        let mut more = false;
        for p in shim::processes() {
            if !found.contains(&p.pid) && (p.pgid == root || found.contains(&p.ppid)) {
                // SAFETY: plain syscall; a process of the job, just seen.
                unsafe {
                    libc::kill(p.pid, libc::SIGSTOP);
                }
                found.push(p.pid);
                more = true;
            }
        }
        if !more {
            break;
        }
    }
    for pid in found {
        // SAFETY: plain syscalls; processes of the job, stopped, and the
        // groups they lead.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::kill(-pid, libc::SIGKILL);
        }
    }
}

#[async_trait]
impl Handler for ExecHandler {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        // The job's recorded steps and its parents' results: one statement,
        // files only when there is something to put in them.
        let inputs = if let Some(inputs) = ctx.inputs.clone() {
            // Read with the lease claim (`reads_inputs` below).
            inputs
        } else {
            let conn = ctx.pool.get().await.map_err(|e| {
                format!("cannot read the job's recorded steps and parents' results: {e}")
            })?;
            crate::steps::inputs(&conn, &[job.id])
                .await
                .map_err(|e| {
                    format!("cannot read the job's recorded steps and parents' results: {e}")
                })?
                .remove(&job.id)
                .unwrap_or_default()
        };
        ctx.steps.prime(inputs.steps.as_deref());
        let files = RunFiles::write(job, &inputs)
            .await
            .map_err(|e| format!("cannot write the job's recorded steps and parents' results to a temporary directory (TMPDIR): {e}"))?;
        drop(inputs);
        let files = files.as_ref();
        let mut shim = exec_shim();
        let spawned = match shim {
            Some(path) => self.command(job, Some(path), ctx.trace(), files).spawn().or_else(|e| {
                // The shim is gone or broken (e.g. removed by an upgrade
                // since start-up): start the command the slow way.
                tracing::warn!(
                    shim = %path.display(),
                    "cannot start the exec shim ({e}); forking the worker for this command instead"
                );
                shim = None;
                self.command(job, None, ctx.trace(), files).spawn()
            }),
            None => self.command(job, None, ctx.trace(), files).spawn(),
        };
        let mut child =
            spawned.map_err(|e| format!("cannot start {}: {e}", self.program.display()))?;
        let mut guard = TreeGuard {
            pid: child.id().map(|p| p as i32),
            shim: shim.is_some(),
        };

        let payload = job.payload_text.clone().into_bytes();
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let mut stderr = child.stderr.take().ok_or("no stderr")?;
        let stdout = child.stdout.take();
        let max = self.stdout_max;
        let output = async move {
            match stdout {
                Some(s) => capture(s, max).await,
                None => (Vec::new(), false),
            }
        };
        let write = async move {
            // A command that does not read stdin closes the pipe: not an error.
            let _ = stdin.write_all(&payload).await;
            let _ = stdin.shutdown().await;
        };
        let mut lines = stderr::Stderr::new(job);
        // The first refused `pgwake-step:` line: the attempt fails with it.
        let mut refused: Option<String> = None;
        let read = async {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                lines.push(&buf[..n]);
                for line in lines.take_progress() {
                    match line.and_then(|rest| stderr::parse_progress(&rest)) {
                        Ok((value, message)) => crate::handlers::report_or_warn(
                            &ctx,
                            job,
                            "exec",
                            &value,
                            message.as_deref(),
                        ),
                        Err(why) => crate::handlers::progress_refused(job, "exec", &why),
                    }
                }
                for line in lines.take_steps() {
                    let recorded = match line.and_then(|rest| parse_step(&rest)) {
                        Ok((name, output)) => ctx
                            .record_step(&name, &output)
                            .await
                            .map_err(|e| e.to_string()),
                        Err(why) => Err(why),
                    };
                    if let Err(why) = recorded {
                        let why = escape_line(why.as_bytes());
                        tracing::warn!(
                            job = job.id,
                            attempt = job.attempt,
                            "refused a {STEP_LINE} line of its exec command, the attempt will fail: {why}"
                        );
                        refused.get_or_insert(why);
                    }
                }
            }
            lines.finish();
        };
        let (_, (), (out, cut), status) = tokio::join!(write, read, output, child.wait());
        let status = status?;
        guard.pid = None;
        let program = self.program.display();
        if let Some(why) = refused {
            let reason = format!(
                "{program}: refused a {STEP_LINE} line, so the attempt fails (steps recorded before it are kept): {why}"
            );
            return Ok(match status.code() {
                Some(EXIT_FAIL) => Outcome::fail(format!("{reason}\n{}", lines.tail())),
                _ => Outcome::retry(reason),
            });
        }
        if status.success() {
            return Ok(match stdout_result(&out, cut) {
                Some(value) => Outcome::DoneWith(value),
                None => Outcome::Done,
            });
        }
        let tail = lines.tail();
        // The shim could not exec the program: the same error as a failed
        // spawn without the shim.
        if shim.is_some()
            && status.code() == Some(i32::from(EXIT_CANNOT_START))
            && tail.starts_with(&format!("cannot start {program}: "))
        {
            return Ok(Outcome::retry(tail));
        }
        let (what, how) = match status.code() {
            Some(EXIT_FAIL) => ("failed for good", format!("exit status {EXIT_FAIL}")),
            Some(EXIT_RETRY_LATER) => (
                "asked to be retried later",
                format!("exit status {EXIT_RETRY_LATER}"),
            ),
            Some(code) => ("failed", format!("exit status {code}")),
            None => {
                use std::os::unix::process::ExitStatusExt;
                let signal = status.signal().unwrap_or(0);
                ("failed", format!("killed by signal {signal}"))
            }
        };
        let reason = if tail.is_empty() {
            format!("{program} {what}: {how}")
        } else {
            format!("{program} {what}: {how}: {tail}")
        };
        Ok(match status.code() {
            Some(EXIT_FAIL) => Outcome::fail(reason),
            Some(EXIT_RETRY_LATER) if lines.snooze().is_some() => {
                match lines.snooze().map(parse_retry_after) {
                    Some(Ok(after)) => Outcome::snooze(after),
                    _ => Outcome::retry(format!(
                        "{reason}\n{SNOOZE_LINE} {:?} is not a delay; expected e.g. `{SNOOZE_LINE} 30` (seconds) or `{SNOOZE_LINE} 5m`: a failed attempt instead",
                        escape_line(lines.snooze().unwrap_or("").as_bytes())
                    )),
                }
            }
            Some(EXIT_RETRY_LATER) => match lines.retry_after().map(parse_retry_after) {
                Some(Ok(after)) => Outcome::retry_after(reason, after),
                Some(Err(why)) => {
                    tracing::warn!(
                        target: LOG_TARGET,
                        job = job.id,
                        task = %escape_line(job.task.as_bytes()),
                        queue = %escape_line(job.queue.as_bytes()),
                        attempt = job.attempt,
                        "{RETRY_AFTER_LINE} {}; the backoff applies",
                        escape_line(why.as_bytes())
                    );
                    Outcome::retry(reason)
                }
                None => Outcome::retry(reason),
            },
            _ => Outcome::retry(reason),
        })
    }

    fn delivery(&self) -> Delivery {
        Delivery::Lease
    }

    fn decodes_payload(&self) -> bool {
        false
    }

    fn reads_inputs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stdout_json_stays_json_and_text_becomes_a_string() {
        assert_eq!(
            stdout_result(b"{\"n\": 1}\n", false),
            Some(serde_json::json!({"n": 1}))
        );
        assert_eq!(
            stdout_result(b"hello\n", false),
            Some(serde_json::json!("hello"))
        );
        assert_eq!(stdout_result(b"  \n", false), None);
        assert_eq!(
            stdout_result(b"{\"n\": 1", true),
            Some(serde_json::json!("{\"n\": 1…[cut]"))
        );
    }
}
