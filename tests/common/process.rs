//! Helpers for tests that run the `pgwake` binary as a child process.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// `pgwake` with a clean environment (no inherited `DATABASE_URL`).
pub fn pgwake_cmd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_pgwake"));
    c.env_remove("DATABASE_URL").env("RUST_LOG", "info");
    c
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

/// Wait for `child` to exit; kill it and fail after `within`.
pub async fn wait_exit(mut child: Child, within: Duration) -> Output {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("did not exit within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    child.wait_with_output().unwrap()
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
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_files(dir, suffix) < n {
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {n} *{suffix} files"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
