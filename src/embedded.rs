//! A throwaway PostgreSQL cluster for `pgwake demo`, `pgwake bench` and the
//! test suite: `initdb` into a temporary directory, `pg_ctl start` on a free
//! loopback port with trust authentication, removed again on drop.
//!
//! The server binaries are found through `pg_config --bindir`, then `PATH`,
//! then `/usr/lib/postgresql/*/bin` (newest first). PostgreSQL refuses to run
//! as root, so as root the cluster is created and run as the `postgres` user
//! (through `runuser`).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// What the user should do when no server binaries are installed.
pub const INSTALL_HINT: &str = "no PostgreSQL server binaries found (looked at `pg_config --bindir`, PATH and /usr/lib/postgresql/*/bin); install them, e.g. `apt-get install postgresql`, or pass --database-url";

/// Settings of a throwaway cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Extra `-c name=value` server settings.
    pub settings: Vec<(String, String)>,
    /// Durable commits (`fsync`, `synchronous_commit`). Off for tests, where
    /// speed matters and the data is thrown away; on for benchmarks, which
    /// must measure what production pays.
    pub durable: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            settings: vec![("max_connections".into(), "300".into())],
            durable: false,
        }
    }
}

/// A running throwaway cluster. Stopped and deleted on drop.
#[derive(Debug)]
pub struct Cluster {
    bindir: PathBuf,
    dir: Option<tempfile::TempDir>,
    data: PathBuf,
    port: u16,
    run_as: Option<String>,
    options: ClusterOptions,
}

/// Find the directory holding `initdb`, `pg_ctl` and `postgres`.
pub fn find_bindir() -> Option<PathBuf> {
    let has_server = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    if let Ok(out) = Command::new("pg_config")
        .arg("--bindir")
        .stderr(Stdio::null())
        .output()
    {
        if out.status.success() {
            let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if has_server(&d) {
                return Some(d);
            }
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for d in std::env::split_paths(&path) {
            if has_server(&d) {
                return Some(d);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let d = e.path().join("bin");
            has_server(&d).then_some((v, d))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, d)| d)
}

fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
        context: "cannot find a free port".into(),
        source,
    })?;
    Ok(l.local_addr().map(|a| a.port()).unwrap_or(0))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

impl Cluster {
    /// Create and start a cluster with default options.
    pub fn start() -> Result<Cluster> {
        Cluster::start_with(ClusterOptions::default())
    }

    /// Create and start a cluster.
    pub fn start_with(options: ClusterOptions) -> Result<Cluster> {
        let bindir = find_bindir().ok_or_else(|| Error::Embedded(INSTALL_HINT.into()))?;
        let run_as = is_root().then(|| "postgres".to_string());
        let dir = tempfile::Builder::new()
            .prefix("pgwake-pg-")
            .tempdir()
            .map_err(|source| Error::Io {
                context: "cannot create a temporary directory".into(),
                source,
            })?;
        let data = dir.path().join("data");
        let mut cluster = Cluster {
            bindir,
            data,
            dir: Some(dir),
            port: 0,
            run_as,
            options,
        };
        if let Some(user) = &cluster.run_as {
            let status = Command::new("chown")
                .arg(user)
                .arg(cluster.dir_path())
                .status()
                .map_err(|source| Error::Io {
                    context: "cannot run chown".into(),
                    source,
                })?;
            if !status.success() {
                return Err(Error::Embedded(format!(
                    "running as root needs a `{user}` system user to run PostgreSQL (chown failed)"
                )));
            }
        }
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data.display().to_string(),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        cluster.start_server()?;
        Ok(cluster)
    }

    fn dir_path(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("/"))
    }

    fn server_options(&self) -> String {
        let mut opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories='{}'",
            self.port,
            self.dir_path().display()
        );
        if !self.options.durable {
            opts.push_str(" -c fsync=off -c synchronous_commit=off -c full_page_writes=off");
        }
        for (k, v) in &self.options.settings {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        opts
    }

    fn start_server(&mut self) -> Result<()> {
        // A free port can be taken between our probe and the server's bind;
        // try a few.
        let mut last = None;
        for _ in 0..5 {
            self.port = free_port()?;
            match self.pg_ctl(&["start", "-w", "-t", "60"]) {
                Ok(()) => return Ok(()),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Embedded("cannot start the server".into())))
    }

    fn pg_ctl(&self, args: &[&str]) -> Result<()> {
        let log = self.dir_path().join("server.log").display().to_string();
        let data = self.data.display().to_string();
        let opts = self.server_options();
        let mut all: Vec<&str> = vec!["-D", &data, "-l", &log, "-o", &opts];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        let exe = self.bindir.join(program);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.arg("-u").arg(user).arg("--").arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let out = cmd
            .args(args)
            .current_dir(self.dir_path())
            .stdin(Stdio::null())
            .output()
            .map_err(|source| Error::Io {
                context: format!("cannot run {}", exe.display()),
                source,
            })?;
        if out.status.success() {
            Ok(())
        } else {
            let log =
                std::fs::read_to_string(self.dir_path().join("server.log")).unwrap_or_default();
            let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            Err(Error::Embedded(format!(
                "{program} failed: {} {} {}",
                String::from_utf8_lossy(&out.stderr).trim(),
                String::from_utf8_lossy(&out.stdout).trim(),
                tail
            )))
        }
    }

    /// The port the server listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for database `db` as the superuser `postgres`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Restart the server. `mode` is `fast` (clean shutdown, sessions are
    /// terminated) or `immediate` (crash-like, recovery on start).
    pub fn restart(&self, mode: &str) -> Result<()> {
        self.pg_ctl(&["restart", "-w", "-t", "60", "-m", mode])
    }

    /// Stop the server (`fast` or `immediate`); [`Cluster::start_again`]
    /// brings it back on the same port.
    pub fn stop(&self, mode: &str) -> Result<()> {
        self.pg_ctl(&["stop", "-w", "-t", "60", "-m", mode])
    }

    /// Start a stopped server again on its port.
    pub fn start_again(&self) -> Result<()> {
        self.pg_ctl(&["start", "-w", "-t", "60"])
    }

    /// Stop the server and delete its files now (also done on drop).
    pub fn shutdown(&mut self) {
        if self.dir.is_some() {
            let _ = self.pg_ctl(&["stop", "-w", "-t", "30", "-m", "immediate"]);
            self.dir.take();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
