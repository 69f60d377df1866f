//! Who may reach the console and how a login behaves: where a login sends
//! the browser back to, the cookie's attributes, the credential check and
//! the limit on wrong guesses, the `Host` check, and the credential for
//! reads on a network address.

use crate::common::*;
use crate::support::*;

/// After a login the browser goes back only to a local path: anything
/// that a browser could read as another site goes to `/`.
#[tokio::test]
async fn a_login_sends_the_browser_back_only_to_a_local_path() {
    let db = migrated_db().await;
    let console = Console::start(&db, true).await;
    for (next, want) in [
        ("/jobs?queue=mail", "/jobs?queue=mail"),
        ("/%09/evil.example", "/"),
        ("/%2F/evil.example", "/"),
        ("//evil.example", "/"),
        ("/\\evil.example", "/"),
        ("https://evil.example/", "/"),
    ] {
        let r = http(
            console.addr,
            "POST",
            "/login",
            &[],
            Some(&format!("token={TOKEN}&next={}", encode(next))),
        )
        .await;
        assert_eq!(r.status, 303, "{next}: {}", r.body);
        assert_eq!(r.header("location"), Some(want), "{next}");
    }
    // A real tab (what `?next=/%09/evil.example` decodes to) is refused
    // as input before the login: no redirect at all.
    let r = http(
        console.addr,
        "POST",
        "/login",
        &[],
        Some(&format!("token={TOKEN}&next=%2F%09%2Fevil.example")),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.header("location"), None);
    let page = get(&console, "/login?next=%2F%09%2Fevil.example").await;
    assert_eq!(page.status, 400, "{}", page.body);
}

/// Wrong credentials sent in parallel (each waits half a second, but not
/// for the others) are limited for the whole console: after a burst of
/// [`console::LOGIN_FAILURES_BURST`] every attempt is refused with 429,
/// the right credential too (else 429 against 303 would tell a guess
/// right), until the bucket refills.
#[tokio::test]
async fn parallel_wrong_credentials_are_limited_for_the_whole_console() {
    use pgwake::console;
    let db = migrated_db().await;
    let c = Console::start(&db, true).await;
    let started = std::time::Instant::now();
    let attempts = 4 * console::LOGIN_FAILURES_BURST;
    let answers = futures::future::join_all((0..attempts).map(|i| {
        let addr = c.addr;
        async move {
            http(
                addr,
                "POST",
                "/login",
                &[],
                Some(&format!("token=wrong-guess-{i:020}")),
            )
            .await
        }
    }))
    .await;
    let refilled = (started.elapsed().as_secs_f64() / console::LOGIN_FAILURE_REFILL.as_secs_f64())
        .ceil() as usize;
    let wrong = answers.iter().filter(|r| r.status == 401).count();
    let limited: Vec<_> = answers.iter().filter(|r| r.status == 429).collect();
    assert_eq!(wrong + limited.len(), attempts, "only 401 and 429");
    assert!(
        wrong <= console::LOGIN_FAILURES_BURST + refilled,
        "{wrong} guesses checked of {attempts} sent at once"
    );
    let r = limited.first().expect("some attempts limited");
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    assert!(
        r.header("content-type")
            .unwrap_or("")
            .starts_with("text/html")
            && r.body.contains("Too many"),
        "{}",
        r.body
    );
    // While the bucket is empty the right credential is refused unchecked.
    if started.elapsed() < console::LOGIN_FAILURE_REFILL {
        let right = http(
            c.addr,
            "POST",
            "/login",
            &[],
            Some(&format!("token={TOKEN}")),
        )
        .await;
        assert_eq!(right.status, 429, "{}", right.body);
        assert!(right.header("set-cookie").is_none());
    }
}

/// `GET path` with this `Host` header (none with `None`).
async fn get_as(addr: std::net::SocketAddr, host: Option<&str>, path: &str) -> Response {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.1\r\n{host}Connection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// DNS rebinding: a page of another site whose name now resolves to
/// 127.0.0.1 reaches the console with its own name in `Host`. The console
/// answers only to an IP address (no name to rebind), `localhost` on its
/// loopback port, and the names given with `--ui-host`; any other gets
/// 421 and a page naming the flag.
#[tokio::test]
async fn the_console_answers_only_to_its_own_names() {
    let db = migrated_db().await;
    let config = pgwake::console::ConsoleConfig {
        hosts: vec!["console.example.com".into(), "ops.example:8443".into()],
        ..pgwake::console::ConsoleConfig::default()
    };
    let c = Console::start_with(&db, "127.0.0.1:0", config)
        .await
        .unwrap();
    let port = c.addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        "console.example.com".to_string(),
        "console.example.com:443".to_string(),
        "ops.example:8443".to_string(),
    ] {
        let r = get_as(c.addr, Some(&host), "/jobs").await;
        assert_eq!(r.status, 200, "{host}: {}", r.body);
    }
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_string(),
        format!("localhost:{}", port.wrapping_add(1)),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        "ops.example:80".to_string(),
        format!("console.example.com.evil.example:{port}"),
        format!("<b>x</b>:{port}"),
    ] {
        for path in ["/jobs", "/", "/fragment/overview", "/login"] {
            let r = get_as(c.addr, Some(&host), path).await;
            assert_eq!(r.status, 421, "{host} {path}: {}", r.body);
            assert!(r.body.contains("--ui-host"), "{}", r.body);
            assert!(!r.body.contains("<b>x"), "escaped: {}", r.body);
        }
    }
    let r = get_as(c.addr, None, "/jobs").await;
    assert!(
        r.status == 400 || r.status == 421,
        "{}: {}",
        r.status,
        r.body
    );
}

/// On an address other than loopback, reading needs the credential too:
/// without it the console does not start (naming PGWAKE_UI_TOKEN and the
/// opt-out); with it, every page but the login form and the assets sends
/// the browser to log in first; `open_reads` serves reads to anyone.
#[tokio::test]
async fn on_a_network_address_reads_need_the_credential() {
    use pgwake::console::ConsoleConfig;
    let db = migrated_db().await;
    let e = match Console::start_with(&db, "0.0.0.0:0", ConsoleConfig::default()).await {
        Ok(_) => panic!("a console open to the network started without a credential"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("PGWAKE_UI_TOKEN") && e.contains("--ui-open-reads"),
        "{e}"
    );
    let read_only = ConsoleConfig {
        token: Some(TOKEN.into()),
        ..ConsoleConfig::default()
    };
    let c = Console::start_with(&db, "0.0.0.0:0", read_only)
        .await
        .unwrap();
    for path in ["/", "/jobs", "/jobs/1", "/queues", "/schedules", "/workers"] {
        let r = get(&c, path).await;
        assert_eq!(r.status, 303, "{path}: {}", r.body);
        assert_eq!(
            r.header("location"),
            Some(format!("/login?next={}", encode(path)).as_str()),
            "{path}"
        );
    }
    assert_eq!(get(&c, "/fragment/overview").await.status, 401);
    assert_eq!(get(&c, "/assets/console.css").await.status, 200);
    let form = get(&c, "/login?next=%2Fjobs").await;
    assert_eq!(form.status, 200, "{}", form.body);
    assert!(form.body.contains("name=\"token\""), "{}", form.body);
    let r = http(
        c.addr,
        "POST",
        "/login",
        &[],
        Some(&format!("token={TOKEN}&next=%2Fjobs")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("location"), Some("/jobs"));
    let cookie = r
        .header("set-cookie")
        .expect("a session to read with")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let page = http(c.addr, "GET", "/jobs", &[("Cookie", &cookie)], None).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("read-only"), "{}", page.body);
    assert!(!page.body.contains("/bulk/review"), "no action forms");
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .expect("a logout form")
        .to_string();
    // Still read-only: acting is refused even logged in.
    let r = http(
        c.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some("queue=mail&op=pause&csrf=x"),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    // Logged out, reading needs a login again.
    let r = http(
        c.addr,
        "POST",
        "/logout",
        &[("Cookie", &cookie)],
        Some(&format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let r = http(c.addr, "GET", "/jobs", &[("Cookie", &cookie)], None).await;
    assert_eq!(r.status, 303, "{}", r.body);

    let open = ConsoleConfig {
        open_reads: true,
        ..ConsoleConfig::default()
    };
    let c = Console::start_with(&db, "0.0.0.0:0", open).await.unwrap();
    assert_eq!(get(&c, "/jobs").await.status, 200);
}

/// A console on loopback behind a proxy on the same host is reached by
/// whoever the proxy lets through: `login_reads` (`--ui-login-reads`) makes
/// reading need the credential there too; without a credential it does not
/// start, naming it. Teeth: with `reads_need_login` looking at the address
/// only, the pages are served to anyone.
#[tokio::test]
async fn behind_a_proxy_on_loopback_reads_can_need_the_credential() {
    use pgwake::console::ConsoleConfig;
    let db = migrated_db().await;
    let e = match Console::start_with(
        &db,
        "127.0.0.1:0",
        ConsoleConfig {
            login_reads: true,
            ..ConsoleConfig::default()
        },
    )
    .await
    {
        Ok(_) => panic!("a console needing a login for reads started without a credential"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("PGWAKE_UI_TOKEN") && e.contains("--ui-login-reads"),
        "{e}"
    );
    let c = Console::start_with(
        &db,
        "127.0.0.1:0",
        ConsoleConfig {
            login_reads: true,
            token: Some(TOKEN.into()),
            ..ConsoleConfig::default()
        },
    )
    .await
    .unwrap();
    for path in ["/", "/jobs", "/queues", "/workers"] {
        let r = get(&c, path).await;
        assert_eq!(r.status, 303, "{path}: {}", r.body);
    }
    assert_eq!(get(&c, "/fragment/overview").await.status, 401);
    let (cookie, _) = login(&c, TOKEN).await.unwrap();
    let page = http(c.addr, "GET", "/jobs", &[("Cookie", &cookie)], None).await;
    assert_eq!(page.status, 200, "{}", page.body);
    // Without the setting, loopback reads stay open, as documented.
    let open = Console::start_with(&db, "127.0.0.1:0", ConsoleConfig::default())
        .await
        .unwrap();
    assert_eq!(get(&open, "/jobs").await.status, 200);
}

/// Behind TLS (`--ui-secure-cookie`) the session cookie is
/// `__Host-pgwake_console` with `Secure`, `Path=/` and no `Domain`, and it
/// is the one read back; without it, plain `pgwake_console`.
#[tokio::test]
async fn behind_tls_the_session_cookie_is_secure_and_host_only() {
    use pgwake::console::ConsoleConfig;
    let db = migrated_db().await;
    for secure in [true, false] {
        let config = ConsoleConfig {
            actions: true,
            token: Some(TOKEN.into()),
            secure_cookie: secure,
            ..ConsoleConfig::default()
        };
        let c = Console::start_with(&db, "127.0.0.1:0", config)
            .await
            .unwrap();
        let r = http(
            c.addr,
            "POST",
            "/login",
            &[],
            Some(&format!("token={TOKEN}")),
        )
        .await;
        let set = r.header("set-cookie").unwrap().to_string();
        if secure {
            assert!(set.starts_with("__Host-pgwake_console="), "{set}");
            assert!(set.contains("; Secure"), "{set}");
            assert!(set.contains("Path=/") && !set.contains("Domain"), "{set}");
        } else {
            assert!(set.starts_with("pgwake_console="), "{set}");
            assert!(!set.contains("Secure"), "{set}");
        }
        let cookie = set.split(';').next().unwrap();
        let page = http(c.addr, "GET", "/queues", &[("Cookie", cookie)], None).await;
        assert!(page.body.contains("actions on"), "{secure}: {}", page.body);
    }
}

/// `pgwake ui` on a network address without a credential is refused at
/// start (exit 2), naming the variable and the opt-out; the console flags
/// of `pgwake run` need `--ui-addr`.
#[test]
fn a_console_open_to_the_network_without_a_credential_is_refused_at_start() {
    let out = pgwake_cmd()
        .args(["ui", "--ui-addr", "0.0.0.0:0"])
        .env_remove("PGWAKE_UI_TOKEN")
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("PGWAKE_UI_TOKEN") && err.contains("--ui-open-reads"),
        "{err}"
    );
    let out = pgwake_cmd()
        .args(["run", "--handler", "t=exec:true", "--ui-host", "x.example"])
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("need --ui-addr"),
        "{out:?}"
    );
}

/// A console on loopback given a proxy's name (`--ui-host`) is likely
/// behind that proxy: it warns at start that its pages are open, naming
/// `--ui-login-reads`; with it, no warning. Teeth: without the check the
/// start-up log says nothing.
#[test]
fn a_loopback_console_behind_a_proxy_warns_until_reads_need_the_login() {
    let start = |extra: &[&str]| {
        let out = pgwake_cmd()
            .args([
                "ui",
                "--ui-addr",
                "127.0.0.1:0",
                "--ui-host",
                "console.example.com",
            ])
            .args(extra)
            .env("PGWAKE_UI_TOKEN", TOKEN)
            .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
            .output()
            .unwrap();
        assert!(!out.status.success(), "no database: {out:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let open = start(&[]);
    assert!(open.contains("pass --ui-login-reads"), "{open}");
    let closed = start(&["--ui-login-reads"]);
    assert!(!closed.contains("--ui-login-reads"), "{closed}");
}
