//! The Python handlers of phase 0: the reference persistent worker
//! (`examples/persistent/worker.py`, task `echo`) and the same no-op as an
//! `exec` command (one `python3` per job), found once per bench. Both run
//! the interpreter `python3` names (`sys.executable`), not `python3` itself:
//! that may be a version manager's shim (pyenv's is a shell script that
//! took 220 ms a start here, against 90 ms for the interpreter), which would
//! flatter the persistent figure.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The reference worker, relative to a repository checkout.
const REFERENCE_WORKER: &str = "examples/persistent/worker.py";

/// The task the reference worker serves as a no-op: its `noop` answers
/// `done`, nothing else.
pub(crate) const TASK: &str = "noop";

/// How the persistent no-op's slots are spread: one process per core
/// (no more than `concurrency`), each taking its share of `concurrency`
/// jobs at once (its `--inflight`): (processes, inflight). What a Python
/// application with CPU-bound handlers would run; more processes than
/// cores only add context switches to every hand-off.
pub(crate) fn shape(concurrency: usize) -> (usize, usize) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let processes = cores.min(concurrency).max(1);
    (processes, concurrency.div_ceil(processes).max(1))
}

/// The Python handlers' commands, or why their figures are skipped.
#[derive(Debug, Clone)]
pub(crate) struct Commands {
    /// `PYTHON …/worker.py`, for `persistent:`.
    pub persistent: String,
    /// `--handler noop=exec:PYTHON -c …`: a Python process per job that
    /// reads its stdin (the payload) and exits 0.
    pub exec_flag: String,
}

/// The commands, found once.
pub(crate) fn commands() -> Result<Commands, String> {
    static FOUND: OnceLock<Result<Commands, String>> = OnceLock::new();
    FOUND.get_or_init(find).clone()
}

fn find() -> Result<Commands, String> {
    let python = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .stderr(std::process::Stdio::null())
        .output();
    let python =
        match python {
            Ok(o) if o.status.success() && !o.stdout.trim_ascii().is_empty() => {
                String::from_utf8_lossy(o.stdout.trim_ascii()).into_owned()
            }
            _ => return Err(
                "python3 is not on PATH (or does not run): the Python handler figures are skipped"
                    .into(),
            ),
        };
    let python = shell_words::quote(&python).into_owned();
    let worker = candidates()
        .into_iter()
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "{REFERENCE_WORKER} was found neither under the current directory, nor above the pgwake binary, nor in the tree it was built from: the persistent figure is skipped (run the bench from a checkout)"
            )
        })?;
    let worker = worker
        .to_str()
        .ok_or("the reference worker's path is not UTF-8")?;
    Ok(Commands {
        persistent: format!("{python} {}", shell_words::quote(worker)),
        exec_flag: format!("noop=exec:{python} -c 'import sys; sys.stdin.read()'"),
    })
}

/// Where to look, in order: the current directory (a checkout), the
/// directories above the binary (`target/release/pgwake` of a checkout),
/// the tree the binary was built from.
fn candidates() -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(REFERENCE_WORKER)];
    if let Ok(exe) = std::env::current_exe() {
        out.extend(
            exe.ancestors()
                .skip(1)
                .take(4)
                .map(|d| d.join(REFERENCE_WORKER)),
        );
    }
    out.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(REFERENCE_WORKER));
    out
}
