//! TLS against a real PostgreSQL with `ssl=on` and certificates made here
//! (a CA, a server certificate for `localhost`, a client certificate), and a
//! `pg_hba.conf` with only `hostssl` lines for TCP: a plain connection is
//! refused, so every connection that works used TLS.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::embedded::{Cluster, ClusterOptions};
use common::*;
use pgwake::{Error, Worker};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};

/// Certificates and keys of one test PKI, as PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
    /// A CA that signed nothing here.
    other_ca: String,
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    (p.self_signed(&key).unwrap(), key)
}

fn pki() -> Pki {
    let (ca_cert, ca_key) = ca("pgwake test CA");
    let mut server = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server_key = KeyPair::generate().unwrap();
    let server_cert = server.signed_by(&server_key, &ca_cert, &ca_key).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "certuser");
    let client_key = KeyPair::generate().unwrap();
    let client_cert = client.signed_by(&client_key, &ca_cert, &ca_key).unwrap();
    let (other, _) = ca("someone else's CA");
    Pki {
        ca: ca_cert.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client_cert.pem(),
        client_key: client_key.serialize_pem(),
        other_ca: other.pem(),
    }
}

/// A TLS-only cluster and the client-side files.
struct TlsServer {
    cluster: Cluster,
    files: tempfile::TempDir,
}

impl TlsServer {
    async fn start() -> TlsServer {
        let pki = pki();
        let hba = "local all all trust\n\
                   hostssl all certuser 127.0.0.1/32 cert\n\
                   hostssl all all 127.0.0.1/32 scram-sha-256\n"
            .to_string();
        let options = ClusterOptions {
            tcp: true,
            hba: Some(hba),
            data_files: vec![
                ("server.crt".into(), pki.server_cert.clone().into_bytes()),
                ("server.key".into(), pki.server_key.clone().into_bytes()),
                ("ca.crt".into(), pki.ca.clone().into_bytes()),
            ],
            settings: vec![
                ("ssl".into(), "on".into()),
                ("ssl_cert_file".into(), "server.crt".into()),
                ("ssl_key_file".into(), "server.key".into()),
                ("ssl_ca_file".into(), "ca.crt".into()),
            ],
            ..ClusterOptions::default()
        };
        let cluster = tokio::task::spawn_blocking(move || Cluster::start_with(options))
            .await
            .unwrap()
            .expect("start a PostgreSQL with ssl=on");
        let files = tempfile::tempdir().unwrap();
        for (name, pem) in [
            ("ca.pem", &pki.ca),
            ("other-ca.pem", &pki.other_ca),
            ("client.pem", &pki.client_cert),
            ("client.key", &pki.client_key),
        ] {
            std::fs::write(files.path().join(name), pem).unwrap();
        }
        let admin = pgwake::connect::connect(
            &pgwake::connect::parse_url(&cluster.url("postgres")).unwrap(),
        )
        .await
        .unwrap();
        admin
            .batch_execute("CREATE ROLE certuser LOGIN")
            .await
            .unwrap();
        TlsServer { cluster, files }
    }

    fn file(&self, name: &str) -> PathBuf {
        self.files.path().join(name)
    }

    /// A URL over TCP to `host` with `params`.
    fn url(&self, host: &str, params: &str) -> String {
        format!(
            "postgres://postgres:{}@{host}:{}/postgres?{params}",
            self.cluster.password(),
            self.cluster.port()
        )
    }

    fn verify_full(&self, host: &str) -> String {
        self.url(
            host,
            &format!(
                "sslmode=verify-full&sslrootcert={}",
                self.file("ca.pem").display()
            ),
        )
    }
}

async fn try_connect(url: &str) -> pgwake::Result<tokio_postgres::Client> {
    pgwake::connect::connect(&pgwake::connect::parse_url(url)?).await
}

async fn uses_tls(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn verify_full_with_the_right_name_runs_migrate_pool_listener_and_cli_over_tls() {
    let server = TlsServer::start().await;
    let url = server.verify_full("localhost");
    let mut client = try_connect(&url).await.expect("verify-full to localhost");
    assert!(uses_tls(&client).await);
    pgwake::admin::schema::migrate(&mut client).await.unwrap();

    // The worker: claim pool and listener, both through TLS (hostssl only).
    let worker = Worker::builder(pgwake::connect::parse_url(&url).unwrap())
        .config(pgwake::WorkerConfig {
            application_name: "pgwake-tls".into(),
            ..test_config()
        })
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.until_listening().await;
    let id: i64 = client
        .query_one("SELECT pgwake.enqueue('t')", &[])
        .await
        .unwrap()
        .get(0);
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!((ev[0].id, ev[0].outcome()), (id, "done"));
    let plain: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name LIKE 'pgwake-tls%' AND NOT s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(plain, 0);
    let listeners: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid)
             WHERE a.application_name = 'pgwake-tls-listener' AND s.ssl",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listeners, 1);
    w.stop.cancel();
    w.join.await.unwrap().unwrap();

    // The CLI, with the TLS settings from PGSSL* variables.
    let out = pgwake_cmd()
        .env(
            "DATABASE_URL",
            format!(
                "postgres://postgres:{}@localhost:{}/postgres",
                server.cluster.password(),
                server.cluster.port()
            ),
        )
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", server.file("ca.pem"))
        .args(["enqueue", "--task", "t"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn verify_full_refuses_a_wrong_host_name_with_one_line_naming_tls_the_host_and_the_fix() {
    let server = TlsServer::start().await;
    // The certificate names `localhost`, not 127.0.0.1.
    let url = server.verify_full("127.0.0.1");
    let Err(err) = try_connect(&url).await else {
        panic!("verify-full to a name the certificate does not hold was accepted")
    };
    let msg = err.to_string();
    assert!(matches!(err, Error::Tls(_)), "{msg}");
    assert!(msg.starts_with("TLS:"), "{msg}");
    assert!(msg.contains("127.0.0.1"), "{msg}");
    assert!(msg.contains("fix:"), "{msg}");
    assert!(!msg.contains(server.cluster.password()), "{msg}");

    let out = pgwake_cmd()
        .env("DATABASE_URL", &url)
        .arg("migrate")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("TLS") && lines[0].contains("127.0.0.1"),
        "{stderr}"
    );

    // verify-ca checks the chain only: the same connection is accepted.
    let ca_only = server.url(
        "127.0.0.1",
        &format!(
            "sslmode=verify-ca&sslrootcert={}",
            server.file("ca.pem").display()
        ),
    );
    let c = try_connect(&ca_only)
        .await
        .expect("verify-ca ignores the name");
    assert!(uses_tls(&c).await);
}

#[tokio::test]
async fn a_certificate_from_an_unknown_ca_is_refused() {
    let server = TlsServer::start().await;
    let url = server.url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={}",
            server.file("other-ca.pem").display()
        ),
    );
    let Err(err) = try_connect(&url).await else {
        panic!("a certificate from an unknown CA was accepted")
    };
    let msg = err.to_string();
    assert!(
        msg.starts_with("TLS:") && msg.contains("sslrootcert"),
        "{msg}"
    );
}

#[tokio::test]
async fn hostssl_only_server_refuses_plain_and_accepts_require_and_prefer() {
    let server = TlsServer::start().await;
    assert!(try_connect(&server.url("127.0.0.1", "sslmode=disable"))
        .await
        .is_err());
    for mode in ["require", "prefer"] {
        let c = try_connect(&server.url("127.0.0.1", &format!("sslmode={mode}")))
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
        assert!(uses_tls(&c).await, "sslmode={mode}");
    }
}

#[tokio::test]
async fn client_certificate_authentication() {
    let server = TlsServer::start().await;
    let url = format!(
        "host=localhost port={} user=certuser dbname=postgres sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
        server.cluster.port(),
        server.file("ca.pem").display(),
        server.file("client.pem").display(),
        server.file("client.key").display()
    );
    let c = try_connect(&url).await.expect("cert auth");
    let user: String = c
        .query_one("SELECT current_user::text", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(user, "certuser");
    // Without the certificate, `cert` authentication refuses.
    let without = format!(
        "host=localhost port={} user=certuser dbname=postgres sslmode=verify-full sslrootcert={}",
        server.cluster.port(),
        server.file("ca.pem").display()
    );
    assert!(try_connect(&without).await.is_err());
    // A missing key file is a start-up error naming the setting.
    let bad = format!("{without} sslcert=/nonexistent.pem sslkey=/nonexistent.key");
    let msg = pgwake::connect::parse_url(&bad).err().unwrap().to_string();
    assert!(msg.contains("sslcert"), "{msg}");
}

#[tokio::test]
async fn require_against_a_server_without_tls_is_one_line_naming_tls_and_the_fix() {
    let cluster = tokio::task::spawn_blocking(|| {
        Cluster::start_with(ClusterOptions {
            tcp: true,
            ..ClusterOptions::default()
        })
    })
    .await
    .unwrap()
    .unwrap();
    let url = format!(
        "postgres://postgres:{}@127.0.0.1:{}/postgres?sslmode=require",
        cluster.password(),
        cluster.port()
    );
    let Err(err) = try_connect(&url).await else {
        panic!("sslmode=require connected without TLS")
    };
    let msg = err.to_string();
    assert!(
        msg.starts_with("TLS:") && msg.contains("does not accept TLS"),
        "{msg}"
    );
    // prefer falls back to plain.
    let prefer = url.replace("require", "prefer");
    assert!(!uses_tls(&try_connect(&prefer).await.unwrap()).await);
}

/// `pgwake stats` against `url` with `env`, as a child process.
async fn stats_with(url: Option<String>, env: Vec<(&'static str, String)>) -> std::process::Output {
    tokio::task::spawn_blocking(move || {
        let mut c = pgwake_cmd();
        for (k, v) in env {
            c.env(k, v);
        }
        if let Some(u) = url {
            c.env("DATABASE_URL", u);
        }
        c.arg("stats").output().unwrap()
    })
    .await
    .unwrap()
}

/// Connection-setting mistakes exit 2 (configuration) and name the setting
/// to fix: verify-full without a root certificate or with a missing file;
/// a plain connection refused by a hostssl-only server says TLS, not "check
/// the password"; a password file others can read is ignored with
/// libpq's warning; settings from the PG* variables are not called
/// DATABASE_URL.
#[tokio::test]
async fn connection_setting_mistakes_name_what_to_fix() {
    let server = TlsServer::start().await;
    for params in [
        "sslmode=verify-full".to_string(),
        "sslmode=verify-full&sslrootcert=/nonexistent/ca.pem".to_string(),
    ] {
        let o = stats_with(Some(server.url("127.0.0.1", &params)), vec![]).await;
        let err = stderr_of(&o);
        assert_eq!(o.status.code(), Some(2), "{params}: {err}");
        assert!(err.contains("sslrootcert"), "{params}: {err}");
    }
    let o = stats_with(Some(server.url("127.0.0.1", "sslmode=disable")), vec![]).await;
    let err = stderr_of(&o);
    assert!(!o.status.success());
    assert!(err.contains("sslmode"), "{err}");
    assert!(!err.contains("check the user and password"), "{err}");

    let pgpass = server.file("pgpass");
    std::fs::write(
        &pgpass,
        format!("*:*:*:postgres:{}\n", server.cluster.password()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o640)).unwrap();
    let env = vec![
        ("PGHOST", "127.0.0.1".to_string()),
        ("PGPORT", server.cluster.port().to_string()),
        ("PGUSER", "postgres".to_string()),
        ("PGDATABASE", "postgres".to_string()),
        ("PGSSLMODE", "require".to_string()),
        ("PGPASSFILE", pgpass.display().to_string()),
    ];
    let o = stats_with(None, env.clone()).await;
    let err = stderr_of(&o);
    assert!(
        !o.status.success(),
        "a group-readable password file is ignored: {err}"
    );
    assert!(
        err.contains("pgpass") || err.contains("password file"),
        "{err}"
    );
    assert!(err.contains("0600"), "{err}");
    assert!(
        !err.contains("DATABASE_URL"),
        "the settings came from PG* variables: {err}"
    );
    // Owner-only, it is used: the connection is made (this database has no
    // pgwake schema, which is what stats says next).
    std::fs::set_permissions(&pgpass, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = stats_with(None, env).await;
    let err = stderr_of(&o);
    assert!(err.contains("pgwake migrate"), "{err}");
    assert!(!err.contains("password"), "{err}");
}
