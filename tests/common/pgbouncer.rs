//! Debian's PgBouncer in front of a throwaway cluster: its own private
//! socket directory, a transaction-mode and a session-mode entry.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::embedded::Cluster;
use super::wait::eventually;

pub fn pgbouncer_binary() -> PathBuf {
    for p in ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer"] {
        if Path::new(p).is_file() {
            return p.into();
        }
    }
    let found = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("pgbouncer"))
            .find(|p| p.is_file())
    });
    found.expect("pgbouncer is not installed: run .ci/deps (apt-get install pgbouncer)")
}

/// A PgBouncer listening only on a Unix socket in its own private
/// directory, with a transaction-mode and a session-mode entry for the
/// cluster's `postgres` database, `pool_size` server connections each.
pub struct Bouncer {
    pub child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Bouncer {
    pub async fn start(cluster: &Cluster, pool_size: usize) -> Bouncer {
        let dir = tempfile::Builder::new()
            .prefix("pgwake-pgbouncer-")
            .tempdir()
            .unwrap();
        let port = 6432;
        let target = format!(
            "host={} port={} dbname=postgres user=postgres",
            cluster.socket_dir().display(),
            cluster.port()
        );
        let ini = format!(
            "[databases]\n\
             app_tx = {target} pool_mode=transaction\n\
             app_session = {target} pool_mode=session\n\
             [pgbouncer]\n\
             listen_addr =\n\
             listen_port = {port}\n\
             unix_socket_dir = {dir}\n\
             unix_socket_mode = 0700\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             max_client_conn = 300\n\
             default_pool_size = {pool_size}\n\
             logfile = {dir}/pgbouncer.log\n\
             pidfile = {dir}/pgbouncer.pid\n",
            dir = dir.path().display()
        );
        std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
        std::fs::write(dir.path().join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        // PgBouncer refuses to run as root; run it as the cluster's user.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let mut cmd = if root {
            let ok = Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown the PgBouncer directory");
            // The child is pgbouncer itself (not `runuser`, which a
            // SIGKILL at the end of the test would leave it orphaned by).
            // SAFETY: getpwnam with a NUL-terminated name; the record is
            // read at once, before any other getpw* call.
            let (uid, gid) = unsafe {
                let pw = libc::getpwnam(c"postgres".as_ptr());
                assert!(!pw.is_null(), "no postgres user (.ci/deps creates it)");
                ((*pw).pw_uid, (*pw).pw_gid)
            };
            let mut c = Command::new(pgbouncer_binary());
            {
                use std::os::unix::process::CommandExt;
                c.uid(uid).gid(gid);
            }
            c
        } else {
            Command::new(pgbouncer_binary())
        };
        let child = cmd
            .arg(dir.path().join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start pgbouncer");
        // The socket file appears at bind(), before listen(): wait until a
        // connection is accepted.
        let socket = dir.path().join(format!(".s.PGSQL.{port}"));
        eventually(
            "pgbouncer accepting connections",
            Duration::from_secs(30),
            || {
                let ready = std::os::unix::net::UnixStream::connect(&socket).is_ok();
                async move { ready }
            },
        )
        .await;
        Bouncer { child, dir, port }
    }

    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@/{db}?host={}&port={}",
            self.dir.path().display(),
            self.port
        )
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
