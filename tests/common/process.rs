//! Helpers for tests that run the `pgwake` binary as a child process.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::wait::wait_for_every;

/// `pgwake` with a clean environment (no inherited `DATABASE_URL`).
pub fn pgwake_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pgwake"));
    c.env_remove("DATABASE_URL").env("RUST_LOG", "info");
    c
}

/// Run `pgwake args` to completion, with `DATABASE_URL` set to `url` if
/// given.
pub fn run_pgwake(args: &[&str], url: Option<&str>) -> Output {
    let mut c = pgwake_cmd();
    if let Some(u) = url {
        c.env("DATABASE_URL", u);
    }
    c.args(args).output().unwrap()
}

/// Run `pgwake args` to completion with `input` on its stdin, with
/// `DATABASE_URL` set to `url` if given.
#[allow(dead_code)]
pub fn run_pgwake_stdin(args: &[&str], url: Option<&str>, input: &str) -> Output {
    use std::io::Write;
    let mut c = pgwake_cmd();
    if let Some(u) = url {
        c.env("DATABASE_URL", u);
    }
    let mut child = c
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A finished command's stderr as text.
pub fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string()
}

/// `pgwake run` against `url` with metrics on a free port and a 200 ms
/// poll, plus `args`; stderr is piped.
pub fn spawn_pgwake_run(url: &str, args: &[&str]) -> Child {
    pgwake_cmd()
        .env("DATABASE_URL", url)
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--poll-interval",
            "200ms",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Send `sig` to `child`.
pub fn send_signal(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// A child that is killed and reaped if the test fails while it runs.
/// A child killed (and reaped) when dropped: a failing test leaves no
/// process behind.
pub struct KillOnDrop(pub Option<Child>);

impl KillOnDrop {
    /// Guard `child`.
    pub fn new(child: Child) -> KillOnDrop {
        KillOnDrop(Some(child))
    }

    /// The child.
    pub fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("a guarded child")
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child().try_wait().unwrap()
    }

    /// The child, no longer guarded.
    pub fn take(mut self) -> Child {
        self.0.take().expect("a guarded child")
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Wait for `child` to exit; kill it and fail after `within`.
pub async fn wait_exit(child: Child, within: Duration) -> Output {
    let mut guard = KillOnDrop(Some(child));
    wait_for_every(
        "the child to exit",
        within,
        Duration::from_millis(20),
        async || match guard.0.as_mut().map(|c| c.try_wait().unwrap()) {
            Some(Some(_)) => Ok(()),
            _ => Err("running".into()),
        },
    )
    .await;
    guard.0.take().unwrap().wait_with_output().unwrap()
}

/// Collect the child's stderr as it is written.
pub fn tail_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    use std::io::BufRead;
    let log = Arc::new(Mutex::new(String::new()));
    let l = log.clone();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let mut l = l.lock().unwrap();
            l.push_str(&line);
            l.push('\n');
        }
    });
    log
}

/// Files in `dir` whose name ends with `suffix`.
pub fn count_files(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(suffix)
        })
        .count()
}

/// Wait until `dir` holds at least `n` files ending with `suffix`.
pub async fn wait_files(dir: &Path, suffix: &str, n: usize) {
    wait_for_every(
        &format!("{n} *{suffix} files"),
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || match count_files(dir, suffix) {
            have if have >= n => Ok(()),
            have => Err(format!("{have} files")),
        },
    )
    .await
}

/// The address a `pgwake run` child serves /metrics on, from its log
/// (`serving /metrics, /health, /ready addr=…`, with `--metrics-addr
/// 127.0.0.1:0`), waiting up to 60 s for the line.
pub async fn metrics_addr(log: &Mutex<String>) -> String {
    super::wait::wait_for(
        "the metrics address in the log",
        Duration::from_secs(60),
        async || {
            let text = log.lock().unwrap().clone();
            text.lines()
                .find(|l| l.contains("serving /metrics"))
                .and_then(|l| l.split("addr=").nth(1))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string)
                .ok_or(text)
        },
    )
    .await
}

/// The sum of the samples of counter or gauge `name` on the worker's
/// /metrics at `addr` whose labels include every one of `labels` (each
/// written `key="value"`).
pub fn metric_sum(addr: &str, name: &str, labels: &[&str]) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let prefix = format!("{name}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix) && labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
