//! libpq conventions: the `PG*` environment without a URL, key=value
//! strings, Unix-socket hosts, against real servers.

use crate::common;

use std::time::Duration;

use common::embedded::{Cluster, ClusterOptions};
use common::*;

async fn tcp_cluster() -> Cluster {
    tokio::task::spawn_blocking(|| {
        Cluster::start_with(ClusterOptions {
            tcp: true,
            ..ClusterOptions::default()
        })
    })
    .await
    .unwrap()
    .expect("start PostgreSQL")
}

async fn count_app_sessions(cluster: &Cluster, app: &str) -> i64 {
    let c =
        pgwake::connect::connect(&pgwake::connect::parse_url(&cluster.url("postgres")).unwrap())
            .await
            .unwrap();
    c.query_one(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1",
        &[&format!("{app}%")],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn libpq_environment_without_a_url_runs_migrate_enqueue_run_and_stats() {
    let cluster = tcp_cluster().await;
    let env = |cmd: &mut std::process::Command| {
        cmd.env("PGHOST", "127.0.0.1")
            .env("PGPORT", cluster.port().to_string())
            .env("PGUSER", "postgres")
            .env("PGPASSWORD", cluster.password())
            .env("PGDATABASE", "postgres")
            .env("PGSSLMODE", "disable")
            .env("PGAPPNAME", "envapp");
    };
    for args in [
        vec!["migrate"],
        vec!["enqueue", "--task", "t"],
        vec!["stats", "--json"],
    ] {
        let mut cmd = pgwake_cmd();
        env(&mut cmd);
        let out = cmd.args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "pgwake {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The worker takes PGAPPNAME as its application_name and runs the job.
    let mut cmd = pgwake_cmd();
    env(&mut cmd);
    let child = cmd
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--handler",
            "t=exec:true",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let admin =
        pgwake::connect::connect(&pgwake::connect::parse_url(&cluster.url("postgres")).unwrap())
            .await
            .unwrap();
    eventually("the job ran", Duration::from_secs(30), || async {
        let left: i64 = admin
            .query_one("SELECT count(*) FROM pgwake.jobs", &[])
            .await
            .unwrap()
            .get(0);
        left == 0
    })
    .await;
    assert!(count_app_sessions(&cluster, "envapp").await >= 1);
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, Duration::from_secs(30)).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn key_value_strings_and_unix_socket_hosts_work_and_tcp_needs_the_password() {
    let cluster = tcp_cluster().await;
    let kv = format!(
        "host={} port={} user=postgres dbname=postgres application_name='kv app'",
        cluster.socket_dir().display(),
        cluster.port()
    );
    let out = pgwake_cmd()
        .env("DATABASE_URL", &kv)
        .arg("migrate")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same server over TCP without a password is refused: the throwaway
    // cluster never trusts TCP.
    let out = pgwake_cmd()
        .env(
            "DATABASE_URL",
            format!(
                "host=127.0.0.1 port={} user=postgres dbname=postgres sslmode=disable",
                cluster.port()
            ),
        )
        .env_remove("PGPASSWORD")
        .arg("migrate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[tokio::test]
async fn the_default_throwaway_cluster_listens_on_no_tcp_port() {
    let db = empty_db().await;
    let c = db.client().await;
    let addrs: String = c
        .query_one("SELECT current_setting('listen_addresses')", &[])
        .await
        .unwrap()
        .get(0);
    // Only when the suite runs against its own throwaway cluster.
    if std::env::var("DATABASE_URL").is_err() {
        assert_eq!(addrs, "");
        let perms: String = c
            .query_one("SELECT current_setting('unix_socket_permissions')", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(perms, "0700");
    }
}

/// A host that accepts TCP connections and never answers (a black hole, a
/// wrong port, a stalled server), on a port of its own: every accepted
/// socket is kept open and silent.
async fn silent_server() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (port, task)
}

/// libpq's `connect_timeout` (URL parameter or `PGCONNECT_TIMEOUT`) bounds
/// the whole connection set-up, not just the TCP connect: against a server
/// that accepts and never answers, commands give up with a message naming
/// the setting instead of hanging, and `pgwake run` stops.
#[tokio::test]
async fn a_server_that_never_answers_is_given_up_on_after_connect_timeout() {
    let (port, _server) = silent_server().await;
    let url = format!("postgres://app@127.0.0.1:{port}/app?sslmode=disable&connect_timeout=1");
    for args in [
        vec!["stats"],
        vec!["migrate"],
        vec!["run", "--fail-fast", "--handler", "t=exec:true"],
    ] {
        let mut c = pgwake_cmd();
        c.env("DATABASE_URL", &url)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let o = wait_exit(c.spawn().unwrap(), Duration::from_secs(60)).await;
        let err = stderr_of(&o);
        assert!(!o.status.success(), "{args:?}: {err}");
        assert!(err.contains("connect_timeout"), "{args:?}: {err}");
        assert!(
            err.contains(&format!("127.0.0.1:{port}")),
            "{args:?}: {err}"
        );
    }
    // The same from the libpq environment.
    let mut c = pgwake_cmd();
    c.env("PGHOST", "127.0.0.1")
        .env("PGPORT", port.to_string())
        .env("PGUSER", "app")
        .env("PGSSLMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "1")
        .arg("stats")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let o = wait_exit(c.spawn().unwrap(), Duration::from_secs(60)).await;
    let err = stderr_of(&o);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains("connect_timeout"), "{err}");
}
