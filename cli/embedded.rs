//! A throwaway PostgreSQL cluster for `pgwake demo`, `pgwake bench` and the
//! test suite: `initdb` into a private temporary directory (mode 0700) and
//! `pg_ctl start`, removed again on drop. It accepts connections only on a
//! Unix socket inside that directory (`trust` there: only the directory's
//! owner can reach it); TCP is off unless a caller asks for it
//! ([`ClusterOptions::tcp`]), and then loopback only, with a random
//! password (`scram-sha-256`), never `trust`.
//!
//! The server binaries are found through `pg_config --bindir`, then `PATH`,
//! then `/usr/lib/postgresql/*/bin` (newest first). PostgreSQL refuses to run
//! as root, so as root the cluster is created and run as the `postgres` user
//! (through `runuser`).

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use pgwake::error::Error as PgwakeError;

/// Why a throwaway cluster could not be set up or driven. The binary's
/// own error: the library knows nothing of throwaway clusters.
#[derive(Debug)]
pub enum Error {
    /// The server binaries are missing, or a server step failed; the
    /// message says which and what to install or check.
    Embedded(String),
    /// An I/O error (a directory, a file, a process).
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Embedded(m) => write!(f, "throwaway PostgreSQL: {m}"),
            Error::Io { context, source } => write!(f, "{context}: {source}"),
        }
    }
}

impl std::error::Error for Error {}

/// A cluster failure as the command line reports it: a missing or broken
/// PostgreSQL installation is the machine's configuration (exit 2).
impl From<Error> for PgwakeError {
    fn from(e: Error) -> PgwakeError {
        match e {
            Error::Embedded(_) => PgwakeError::Config(e.to_string()),
            Error::Io { context, source } => PgwakeError::Io { context, source },
        }
    }
}

/// The result of a cluster operation.
pub type Result<T> = std::result::Result<T, Error>;

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
    /// Also listen on 127.0.0.1 (password authentication). Default off:
    /// the socket in the private directory is the only way in.
    pub tcp: bool,
    /// Replace `pg_hba.conf` with this text (tests of TLS-only or
    /// certificate authentication).
    pub hba: Option<String>,
    /// Files written into the data directory before the server starts
    /// (mode 0600, owned by the server's user), e.g. TLS keys.
    pub data_files: Vec<(String, Vec<u8>)>,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            settings: vec![("max_connections".into(), "300".into())],
            durable: false,
            tcp: false,
            hba: None,
            data_files: Vec::new(),
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
    password: String,
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
        let mut cluster = Cluster::new_dir(options)?;
        let pwfile = cluster.dir_path().join("pwfile");
        cluster.write_private(&pwfile, cluster.password.as_bytes())?;
        cluster.run(
            "initdb",
            &[
                "-D",
                &cluster.data.display().to_string(),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                &format!("--pwfile={}", pwfile.display()),
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        )?;
        let _ = std::fs::remove_file(&pwfile);
        if let Some(hba) = cluster.options.hba.clone() {
            cluster.write_private(&cluster.data.join("pg_hba.conf"), hba.as_bytes())?;
        }
        for (name, bytes) in cluster.options.data_files.clone() {
            cluster.write_private(&cluster.data.join(name), &bytes)?;
        }
        cluster.start_server()?;
        Ok(cluster)
    }

    /// A cluster value with its private directory (owned by the server's
    /// user), nothing in it yet.
    fn new_dir(options: ClusterOptions) -> Result<Cluster> {
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
        let cluster = Cluster {
            bindir,
            data,
            dir: Some(dir),
            port: 0,
            run_as,
            options,
            password: format!("{:032x}", rand::random::<u128>()),
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
        Ok(cluster)
    }

    /// Write a file only the server's user can read.
    fn write_private(&self, path: &Path, bytes: &[u8]) -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let io = |source| Error::Io {
            context: format!("cannot write {}", path.display()),
            source,
        };
        std::fs::write(path, bytes).map_err(io)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
        if let Some(user) = &self.run_as {
            let ok = Command::new("chown")
                .arg(user)
                .arg(path)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                return Err(Error::Embedded(format!(
                    "cannot chown {} to {user}",
                    path.display()
                )));
            }
        }
        Ok(())
    }

    /// The private directory holding the data directory and the socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir_path()
    }

    fn dir_path(&self) -> &Path {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .unwrap_or(Path::new("/"))
    }

    fn server_options(&self) -> String {
        let mut opts = format!(
            "-p {} -c listen_addresses={} -c unix_socket_directories='{}' -c unix_socket_permissions=0700",
            self.port,
            if self.options.tcp { "127.0.0.1" } else { "''" },
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

    /// A URL for database `db` as the superuser `postgres`, through the
    /// socket in the private directory.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@/{db}?host={}&port={}",
            self.dir_path().display(),
            self.port
        )
    }

    /// Stop the server and delete its files now (also done on drop).
    pub fn shutdown(&mut self) {
        if self.dir.is_some() {
            let _ = self.pg_ctl(&["stop", "-w", "-t", "30", "-m", "immediate"]);
            self.dir.take();
        }
    }
}

/// For the test suite: fault injection for the outage tests (the binary
/// itself never restarts its clusters), TCP access for the TLS tests, and
/// streaming standbys for the failover test.
#[allow(dead_code)]
impl Cluster {
    /// A streaming standby of this cluster (`pg_basebackup -R` through the
    /// primary's socket), started in its own private directory.
    pub fn start_standby(&self) -> Result<Cluster> {
        let mut standby = Cluster::new_dir(self.options.clone())?;
        standby.password = self.password.clone();
        let port = self.port.to_string();
        let socket = self.dir_path().display().to_string();
        let data = standby.data.display().to_string();
        standby.run(
            "pg_basebackup",
            &[
                "-D",
                &data,
                "-R",
                "-X",
                "stream",
                "-h",
                &socket,
                "-p",
                &port,
                "-U",
                "postgres",
                "--no-sync",
            ],
        )?;
        standby.start_server()?;
        Ok(standby)
    }

    /// Promote a standby to primary and wait until it accepts writes.
    pub fn promote(&self) -> Result<()> {
        let data = self.data.display().to_string();
        self.run("pg_ctl", &["promote", "-w", "-t", "60", "-D", &data])
    }

    /// The server's port: it names the socket (`.s.PGSQL.PORT`) and, with
    /// [`ClusterOptions::tcp`], the loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL over TCP (127.0.0.1, with the superuser's password); only
    /// reachable with [`ClusterOptions::tcp`].
    pub fn tcp_url(&self, db: &str) -> String {
        format!(
            "postgres://postgres:{}@127.0.0.1:{}/{db}",
            self.password, self.port
        )
    }

    /// The superuser's password (TCP connections need it).
    pub fn password(&self) -> &str {
        &self.password
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

    /// Stop the server now and leave its files to a detached `rm -rf`: a
    /// test binary's shared cluster holds a database per test (tens of
    /// thousands of files), and removing them in the exiting process kept
    /// each test binary alive for a minute or two after its last test.
    pub fn shutdown_removing_later(&mut self) {
        if self.dir.is_none() {
            return;
        }
        let _ = self.pg_ctl(&["stop", "-w", "-t", "30", "-m", "immediate"]);
        if let Some(dir) = self.dir.take() {
            let path = dir.keep();
            let mut rm = Command::new("rm");
            rm.arg("-rf")
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            // Its own session: the test runner's signals and terminal are
            // not its; the process exits without waiting for it.
            // SAFETY: setsid is async-signal-safe.
            unsafe {
                rm.pre_exec(|| {
                    libc::setsid();
                    Ok(())
                });
            }
            if rm.spawn().is_err() {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}
