//! The exec shim: an `exec` command started at `posix_spawn` speed whose
//! whole process tree dies with its worker, at its timeout and on cancel.
//!
//! The worker spawns, with `posix_spawn`, `SHIM __exec-shim PPID PROGRAM
//! ARGS…` in a process group of its own; the shim's `main` calls
//! [`run_if_asked`] first thing. The shim blocks SIGCHLD and SIGTERM (it
//! reads them with `sigwaitinfo`), becomes a child subreaper
//! (`PR_SET_CHILD_SUBREAPER`: every process of the job that loses its
//! parent, a daemon that double-forked, is re-parented to the shim instead
//! of to init, so it can still be found), asks for SIGTERM when its parent
//! dies (`PR_SET_PDEATHSIG`), checks that its parent is still `PPID` (a
//! worker that died before the `prctl` sends no signal: the shim then kills
//! itself, as before), and `posix_spawnp`s the command in a process group
//! of its own, with no signal blocked and SIGPIPE at its default (the Rust
//! runtime ignores it). It then lets go of the job's pipes (its standard
//! streams become `/dev/null`) and waits:
//!
//! - the command exits: what is left of its tree is killed ([`kill_tree`]),
//!   and the shim ends as the command did (same exit status, or killed by
//!   the same signal): a job's processes never outlive it, so a retry
//!   never runs beside a leftover of the attempt before;
//! - SIGTERM, from the worker (the job's timeout, its cancel, a shutdown
//!   past its grace period) or as the death signal of a worker that died:
//!   the whole tree is killed, then the shim kills itself with SIGKILL, as
//!   a command killed at its timeout was before.
//!
//! [`kill_tree`] sends SIGKILL to the command's process group and to every
//! child of the shim (and its group), then reaps, and repeats until the
//! shim has no child left: a process that left the group (`setsid`) is
//! still a descendant, and is re-parented to the shim when its parent
//! dies. The shim exits only when the whole tree is gone, so the worker,
//! which waits for it, records the job's outcome after that.
//!
//! The shim is the small [`EXEC_SHIM_BINARY`] installed beside `pgwake`,
//! which the `pgwake` binary enables when it finds it. Not `pgwake` itself:
//! its start-up (about 49,000 relocations applied by the dynamic loader)
//! cost more per job than the fork it saved. Rust programs that embed the
//! library and never call [`use_exec_shim`] keep the forking path (see
//! `handlers/exec.rs`); so does a spawn the shim fails (e.g. a shim removed
//! since start-up).

use std::ffi::{CString, OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The file name of the exec shim binary, which `pgwake` looks for in its
/// own directory.
pub const EXEC_SHIM_BINARY: &str = "pgwake-exec-shim";

/// The hidden first argument that makes a binary the exec shim
/// (`BINARY __exec-shim PPID PROGRAM ARGS…`).
pub const EXEC_SHIM_ARG: &str = "__exec-shim";

/// Exit status of the shim when the command cannot be started (as a
/// shell's for a command not found): its stderr then says
/// `cannot start PROGRAM: ERROR`.
pub const EXIT_CANNOT_START: u8 = 127;

/// The signal that asks the shim to kill its command's whole process tree
/// and exit: the worker sends it at the job's timeout, on cancel and at a
/// shutdown past its grace period, and it is the shim's death signal.
pub const EXEC_SHIM_STOP: libc::c_int = libc::SIGTERM;

static SHIM: OnceLock<PathBuf> = OnceLock::new();

/// Start `exec` commands through `binary`, which must call [`run_if_asked`]
/// first thing in its `main` ([`EXEC_SHIM_BINARY`] does): the commands are
/// then spawned with `posix_spawn` instead of `fork`, and their whole
/// process trees die with the worker. Set once per process; returns false
/// (and changes nothing) if it was already set.
pub fn use_exec_shim(binary: impl Into<PathBuf>) -> bool {
    SHIM.set(binary.into()).is_ok()
}

/// The binary set by [`use_exec_shim`], if any.
pub fn exec_shim() -> Option<&'static Path> {
    SHIM.get().map(PathBuf::as_path)
}

/// If this process was started as the exec shim (its first argument is
/// [`EXEC_SHIM_ARG`]), run the command and supervise its process tree:
/// returns the exit status to end with (the command's, or
/// [`EXIT_CANNOT_START`] after a line on stderr if it cannot be started;
/// a command killed by a signal, or a stop request, ends the shim by a
/// signal instead). `None` when the process is not the shim. Call it
/// before anything else in `main` (no logging, threads or runtime).
pub fn run_if_asked() -> Option<u8> {
    let mut args = std::env::args_os();
    args.next();
    if args.next().as_deref() != Some(OsStr::new(EXEC_SHIM_ARG)) {
        return None;
    }
    Some(run(args.collect()))
}

/// A line on stderr, ignoring errors (nobody may be reading any more).
fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A signal set of `signals`.
fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset initialise and fill a set we own.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

extern "C" {
    static environ: *const *mut libc::c_char;
}

/// The shim proper, given `PPID PROGRAM ARGS…`.
fn run(args: Vec<OsString>) -> u8 {
    let Some((ppid, command)) = args.split_first().filter(|(_, c)| !c.is_empty()) else {
        say(&format!(
            "pgwake {EXEC_SHIM_ARG}: expected PPID PROGRAM [ARGS…] (an internal mode of the exec handler)"
        ));
        return EXIT_CANNOT_START;
    };
    let program = Path::new(&command[0]).display().to_string();
    let Some(ppid) = ppid.to_str().and_then(|p| p.parse::<libc::pid_t>().ok()) else {
        say(&format!(
            "cannot start {program}: pgwake {EXEC_SHIM_ARG}: {ppid:?} is not a process id"
        ));
        return EXIT_CANNOT_START;
    };
    let argv: Result<Vec<CString>, _> =
        command.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(argv) = argv else {
        say(&format!(
            "cannot start {program}: an argument contains a NUL byte"
        ));
        return EXIT_CANNOT_START;
    };
    let mut ptrs: Vec<*mut libc::c_char> = argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    ptrs.push(std::ptr::null_mut());

    // SIGCHLD and the stop signal are read with sigwaitinfo, never handled.
    let waited = sigset(&[libc::SIGCHLD, EXEC_SHIM_STOP]);
    // SAFETY: plain syscalls with valid arguments.
    unsafe {
        libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut());
        // Orphans of the job come to the shim, not to init. (Only fails on
        // kernels before 3.4: a daemon that double-forks then escapes.)
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1);
        if libc::prctl(libc::PR_SET_PDEATHSIG, EXEC_SHIM_STOP) != 0 {
            let e = std::io::Error::last_os_error();
            say(&format!(
                "cannot start {program}: cannot set the death signal: {e}"
            ));
            return EXIT_CANNOT_START;
        }
        // The worker may have died between the spawn and the prctl: then
        // no signal comes, and this process has a new parent. End as the
        // worker's death ends a command, before starting anything.
        if libc::getppid() != ppid {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }

    let child = match spawn(&ptrs) {
        Ok(pid) => pid,
        Err(e) => {
            say(&format!("cannot start {program}: {e}"));
            return EXIT_CANNOT_START;
        }
    };
    release_streams();
    supervise(child, &waited)
}

/// `posix_spawnp` the command (`argv`, NULL-terminated) in a process group
/// of its own, with no signal blocked and SIGPIPE at its default.
fn spawn(argv: &[*mut libc::c_char]) -> std::io::Result<libc::pid_t> {
    // SAFETY: the attribute object is initialised before use and destroyed
    // after; `argv` is a NULL-terminated array of C strings that outlive
    // the call; `environ` is this process's environment.
    unsafe {
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        let r = libc::posix_spawnattr_init(&mut attr);
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
        let none = sigset(&[]);
        let default = sigset(&[libc::SIGPIPE, libc::SIGCHLD, EXEC_SHIM_STOP]);
        libc::posix_spawnattr_setflags(
            &mut attr,
            (libc::POSIX_SPAWN_SETPGROUP
                | libc::POSIX_SPAWN_SETSIGMASK
                | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
        );
        libc::posix_spawnattr_setpgroup(&mut attr, 0);
        libc::posix_spawnattr_setsigmask(&mut attr, &none);
        libc::posix_spawnattr_setsigdefault(&mut attr, &default);
        let mut pid: libc::pid_t = 0;
        let r = libc::posix_spawnp(
            &mut pid,
            argv[0],
            std::ptr::null(),
            &attr,
            argv.as_ptr(),
            environ,
        );
        libc::posix_spawnattr_destroy(&mut attr);
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r));
        }
        Ok(pid)
    }
}

/// Point the shim's standard streams at `/dev/null`: the job's pipes are
/// the command's, and the worker reads their end of file when the
/// command's tree closes them, not when the shim exits.
fn release_streams() {
    // SAFETY: plain syscalls on descriptors this process owns.
    unsafe {
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
        for fd in 0..3 {
            if null >= 0 {
                libc::dup2(null, fd);
            } else {
                libc::close(fd);
            }
        }
        if null > 2 {
            libc::close(null);
        }
    }
}

/// Wait for the command to exit or for the stop signal; then kill what is
/// left of the tree and end as the command did (or by SIGKILL when
/// stopped).
fn supervise(child: libc::pid_t, waited: &libc::sigset_t) -> u8 {
    let mut status = None;
    loop {
        // SAFETY: `waited` is blocked; `info` is a valid out-parameter.
        let signal = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(waited, &mut info)
        };
        if signal == EXEC_SHIM_STOP {
            break;
        }
        if signal == libc::SIGCHLD && reap(child, &mut status) {
            break;
        }
    }
    kill_tree(child, &mut status);
    match status {
        Some(status) if libc::WIFEXITED(status) => libc::WEXITSTATUS(status) as u8,
        Some(status) if libc::WIFSIGNALED(status) => die_by(libc::WTERMSIG(status)),
        _ => die_by(libc::SIGKILL),
    }
}

/// Reap every child that has ended (orphans of the job, re-parented here,
/// and the command); true once the command has ended, its wait status then
/// in `status`.
fn reap(child: libc::pid_t, status: &mut Option<libc::c_int>) -> bool {
    loop {
        let mut s = 0;
        // SAFETY: plain syscall with a valid out-parameter.
        let pid = unsafe { libc::waitpid(-1, &mut s, libc::WNOHANG) };
        if pid <= 0 {
            return status.is_some();
        }
        if pid == child {
            *status = Some(s);
        }
    }
}

/// Kill every process of the job: the command's process group (`group`,
/// the command's pid) and every child of the shim with its own group,
/// reaping as they die, until the shim has no child left. A process that
/// left the group is still a descendant: re-parented to the shim (a child
/// subreaper) when its parent dies, it is found in the next round.
fn kill_tree(group: libc::pid_t, status: &mut Option<libc::c_int>) {
    let sigchld = sigset(&[libc::SIGCHLD]);
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    loop {
        // SAFETY: plain syscall; a group that no longer exists is ESRCH.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        reap(group, status);
        // SAFETY: a query only (WNOWAIT): does any child remain?
        let left = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_ALL,
                0,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            ) == 0
        };
        if !left {
            return;
        }
        for pid in children_of(me) {
            // SAFETY: our own children (a child's pid cannot be reused
            // before we reap it) and their groups.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        // Until a child dies (or 10 ms: a child re-parented since the scan
        // is killed in the next round).
        let wait = libc::timespec {
            tv_sec: 0,
            tv_nsec: 10_000_000,
        };
        // SAFETY: SIGCHLD is blocked; null info is allowed.
        unsafe {
            libc::sigtimedwait(&sigchld, std::ptr::null_mut(), &wait);
        }
    }
}

/// The pids of the processes whose parent is `parent`, from `/proc`.
fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    processes()
        .into_iter()
        .filter(|p| p.ppid == parent)
        .map(|p| p.pid)
        .collect()
}

/// One process of `/proc`: its id, its parent's and its process group's.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Process {
    pub pid: libc::pid_t,
    pub ppid: libc::pid_t,
    pub pgid: libc::pid_t,
}

/// Every process this one can see in `/proc` (those that vanish while it
/// reads are left out).
pub(crate) fn processes() -> Vec<Process> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let name = e.ok()?.file_name();
        let pid: libc::pid_t = name.to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid pgrp …": comm may hold anything, so read
        // after its last ')'.
        let mut fields = stat.rsplit_once(')')?.1.split_ascii_whitespace();
        fields.next()?;
        let ppid = fields.next()?.parse().ok()?;
        let pgid = fields.next()?.parse().ok()?;
        Some(Process { pid, ppid, pgid })
    })
    .collect()
}

/// End this process by `signal`, as the command ended (no core file);
/// `128 + signal` if the signal does not end it.
fn die_by(signal: libc::c_int) -> u8 {
    // SAFETY: plain syscalls with valid arguments.
    unsafe {
        let none = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::setrlimit(libc::RLIMIT_CORE, &none);
        libc::signal(signal, libc::SIG_DFL);
        let set = sigset(&[signal]);
        libc::sigprocmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), signal);
    }
    (128 + signal) as u8
}
