//! The console under test (in process, on a free loopback port, against a
//! test database), a plain HTTP/1.1 client for the auth and escaping
//! checks, and a headless Chromium driven through chromedriver
//! (Debian's `chromium` and `chromium-driver`; nothing is downloaded).

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pgwake::console::{self, ConsoleConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::common::*;

/// The credential of the consoles with actions.
pub const TOKEN: &str = "test-token-0123456789abcdef";

/// A console serving a test database.
pub struct Console {
    pub addr: SocketAddr,
    stop: CancellationToken,
}

impl Console {
    /// Serve `db`, with actions (and [`TOKEN`]) or read-only.
    pub async fn start(db: &TestDb, actions: bool) -> Console {
        let config = ConsoleConfig {
            actions,
            token: actions.then(|| TOKEN.to_string()),
            refresh: Duration::from_millis(500),
            ..ConsoleConfig::default()
        };
        Console::start_with(db, "127.0.0.1:0", config)
            .await
            .unwrap()
    }

    /// Serve `db` on `addr` with `config` (the start-up's refusal as is).
    /// [`Console::addr`] is the loopback address to reach it by.
    pub async fn start_with(
        db: &TestDb,
        addr: &str,
        config: ConsoleConfig,
    ) -> pgwake::error::Result<Console> {
        let listener = console::bind(addr.parse().unwrap()).await?;
        let pool = console::pool(&db.config())?;
        let stop = CancellationToken::new();
        let (mut addr, _task) = console::serve_on(listener, pool, config, stop.clone())?;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        Ok(Console { addr, stop })
    }

    /// `http://ADDR` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An HTTP response: status, headers (lower-case names), body.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first header of that (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request (`Connection: close`), `extra` headers as given.
pub async fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    form: Option<&str>,
) -> Response {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in extra {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = form {
        req.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ));
    } else {
        req.push_str("\r\n");
    }
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), s.read_to_end(&mut raw))
        .await
        .expect("the console answers within 30 s")
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
    // Bodies may come chunked: good enough to search in, as the tests do.
    Response {
        status,
        headers,
        body: body.to_string(),
    }
}

/// `GET path`.
pub async fn get(c: &Console, path: &str) -> Response {
    http(c.addr, "GET", path, &[], None).await
}

/// Log in with `token`; the session cookie (`name=value`) and the CSRF
/// token of the forms.
pub async fn login(c: &Console, token: &str) -> Option<(String, String)> {
    let r = http(
        c.addr,
        "POST",
        "/login",
        &[],
        Some(&format!("token={}&next=%2Fjobs", encode(token))),
    )
    .await;
    let cookie = r.header("set-cookie")?.split(';').next()?.to_string();
    let page = http(c.addr, "GET", "/jobs", &[("Cookie", &cookie)], None).await;
    let csrf = page
        .body
        .split("name=\"csrf\" value=\"")
        .nth(1)?
        .split('"')
        .next()?
        .to_string();
    Some((cookie, csrf))
}

/// Percent-encode a form value.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A chromedriver on a free port and a headless Chromium session, in a
/// process group of their own (killed whole when the test ends, also on a
/// failure), with a throwaway profile directory.
pub struct Browser {
    pub client: fantoccini::Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

fn executable(names: &[&str]) -> Option<String> {
    let path = std::env::var("PATH").unwrap_or_default();
    for name in names {
        for dir in path.split(':').chain(["/usr/bin", "/usr/lib/chromium"]) {
            let p = std::path::Path::new(dir).join(name);
            if p.is_file() {
                return Some(p.display().to_string());
            }
        }
    }
    None
}

impl Browser {
    /// Start chromedriver and a headless Chromium (1280×900).
    pub async fn start() -> Browser {
        let driver_bin = executable(&["chromedriver"])
            .expect("chromedriver (Debian: chromium-driver; .ci/deps installs it)");
        let chromium = executable(&["chromium", "chromium-browser"])
            .expect("chromium (Debian: chromium; .ci/deps installs it)");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        use std::os::unix::process::CommandExt;
        let driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let url = format!("http://127.0.0.1:{port}");
        let mut caps = serde_json::Map::new();
        let profile = tempfile::tempdir().unwrap();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,900", "--no-first-run", "--disable-extensions",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let mut last = None;
        for _ in 0..100 {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match fantoccini::ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(client) => {
                    return Browser {
                        client,
                        driver,
                        _profile: profile,
                    }
                }
                Err(e) => last = Some(e.to_string()),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // SAFETY: kill(2) on the process group of our own child.
        unsafe {
            libc::kill(-(driver.id() as i32), libc::SIGKILL);
        }
        panic!("no WebDriver session: {last:?}");
    }

    /// Whether the page defines `window.pwned` (a payload that ran).
    pub async fn pwned(&self) -> bool {
        self.client
            .execute("return typeof window.pwned !== 'undefined';", vec![])
            .await
            .unwrap()
            .as_bool()
            .unwrap()
    }

    /// Close the session; dropping stops chromedriver and the browser.
    pub async fn close(self) {
        let _ = self.client.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group of our own child.
        unsafe {
            libc::kill(-(self.driver.id() as i32), libc::SIGKILL);
        }
        let _ = self.driver.wait();
    }
}

/// Wait until `cond` holds, checking every 100 ms, for at most `secs`.
pub async fn until<F, Fut>(what: &str, secs: u64, cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    eventually(what, Duration::from_secs(secs), cond).await;
}
