//! The exec shim: an `exec` command started at `posix_spawn` speed that
//! still dies with its worker.
//!
//! The death signal (`PR_SET_PDEATHSIG(SIGKILL)`) must be set by the new
//! process itself, between its start and the `exec` of the command. Set in
//! a `pre_exec` closure, it makes the standard library `fork` the worker
//! (copying its page tables) instead of using `posix_spawn`. With a shim
//! enabled ([`use_exec_shim`]), the handler instead spawns, with
//! `posix_spawn`, `SHIM __exec-shim PPID PROGRAM ARGS…`; the shim's `main`
//! calls [`run_if_asked`] first thing, which sets the death signal, checks
//! that its parent is still `PPID` (a worker that died before the `prctl`
//! sends no signal: the shim then kills itself, as the signal would have),
//! restores SIGPIPE's default and `execvp`s the command. The command keeps
//! the shim's process id, process group, environment and standard streams,
//! all set by the `posix_spawn`.
//!
//! The shim is the small [`EXEC_SHIM_BINARY`] installed beside `pgwake`,
//! which the `pgwake` binary enables when it finds it. Not `pgwake` itself:
//! its start-up (about 49,000 relocations applied by the dynamic loader)
//! cost more per job than the fork it saved. Rust programs that embed the
//! library and never call [`use_exec_shim`] keep the `pre_exec` path; so
//! does a spawn the shim fails (e.g. a shim removed since start-up).

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

static SHIM: OnceLock<PathBuf> = OnceLock::new();

/// Start `exec` commands through `binary`, which must call [`run_if_asked`]
/// first thing in its `main` ([`EXEC_SHIM_BINARY`] does): the commands are
/// then spawned with `posix_spawn` instead of `fork`, and still die with the
/// worker. Set once per process; returns false (and changes nothing) if it
/// was already set.
pub fn use_exec_shim(binary: impl Into<PathBuf>) -> bool {
    SHIM.set(binary.into()).is_ok()
}

/// The binary set by [`use_exec_shim`], if any.
pub fn exec_shim() -> Option<&'static Path> {
    SHIM.get().map(PathBuf::as_path)
}

/// If this process was started as the exec shim (its first argument is
/// [`EXEC_SHIM_ARG`]), become the command: on success this never returns;
/// if the command cannot be started, the exit status to end with
/// ([`EXIT_CANNOT_START`], after a line on stderr). `None` when the process
/// is not the shim. Call it before anything else in `main` (no logging,
/// threads or runtime).
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
    // SAFETY: plain syscall with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        let e = std::io::Error::last_os_error();
        say(&format!(
            "cannot start {program}: cannot set the death signal: {e}"
        ));
        return EXIT_CANNOT_START;
    }
    // The worker may have died between the spawn and the prctl: then no
    // signal comes, and this process has a new parent. End as the signal
    // would have ended it.
    // SAFETY: plain syscalls.
    unsafe {
        if libc::getppid() != ppid {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    let argv: Result<Vec<CString>, _> =
        command.iter().map(|a| CString::new(a.as_bytes())).collect();
    let Ok(argv) = argv else {
        say(&format!(
            "cannot start {program}: an argument contains a NUL byte"
        ));
        return EXIT_CANNOT_START;
    };
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: `ptrs` is a NULL-terminated array of pointers to C strings
    // that outlive the call. The Rust runtime ignores SIGPIPE; an ignored
    // signal stays ignored across exec, so the default is restored first,
    // as the standard library does for the processes it spawns.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::execvp(ptrs[0], ptrs.as_ptr());
    }
    let e = std::io::Error::last_os_error();
    say(&format!("cannot start {program}: {e}"));
    EXIT_CANNOT_START
}
