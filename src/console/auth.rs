//! Who may reach, read and act. Every request's `Host` must name this
//! console ([`host_allowed`], against DNS rebinding; else 421). On an
//! address other than loopback reading needs a login too (unless
//! `--ui-open-reads`). With `--ui-actions`, an operator logs in with the
//! credential (`PGWAKE_UI_TOKEN`) and gets a session cookie (`HttpOnly`,
//! `SameSite=Strict`; `__Host-` and `Secure` with `--ui-secure-cookie`);
//! every state-changing request must carry that cookie, the session's CSRF
//! token (a hidden field of every form) and, when the browser sends one,
//! an `Origin` of this console. Without `--ui-actions` every action is
//! refused. Logins share one token bucket ([`Limiter`]) and the credential
//! is compared by fixed-length digests ([`Secrets`]). Sessions live in
//! memory: a restart logs everyone out.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;

use super::error::PageError;
use super::input::Form;
use super::view::{page, Who};
use super::App;
use maud::html;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "pgwake_console";

/// The session cookie's name behind TLS (`--ui-secure-cookie`): with the
/// `__Host-` prefix a browser keeps it only when it came with `Secure`,
/// `Path=/` and no `Domain`, so no other host or plain-HTTP page can set it.
pub(crate) const SECURE_COOKIE: &str = "__Host-pgwake_console";

/// The session cookie's name and the attributes beyond the shared ones.
fn cookie_kind(app: &App) -> (&'static str, &'static str) {
    if app.config.secure_cookie {
        (SECURE_COOKIE, "; Secure")
    } else {
        (COOKIE, "")
    }
}

/// A session ends this long after login.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// Most sessions kept; the oldest go first.
const SESSIONS_MAX: usize = 1000;

/// The logged-in sessions: id → (CSRF token, since).
#[derive(Default)]
pub(crate) struct Sessions(Mutex<HashMap<String, (String, Instant)>>);

impl Sessions {
    fn create(&self) -> (String, String) {
        let id = random_hex();
        let csrf = random_hex();
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, (_, since)| since.elapsed() < SESSION_TTL);
        while map.len() >= SESSIONS_MAX {
            let oldest = map
                .iter()
                .min_by_key(|(_, (_, since))| *since)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(id.clone(), (csrf.clone(), Instant::now()));
        (id, csrf)
    }

    fn csrf_of(&self, id: &str) -> Option<String> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(id)
            .filter(|(_, since)| since.elapsed() < SESSION_TTL)
            .map(|(csrf, _)| csrf.clone())
    }

    fn remove(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
    }
}

fn random_hex() -> String {
    rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Compares secrets (the credential, CSRF tokens) in constant time and
/// without telling their length: both sides are first reduced to
/// HMAC-SHA-256 digests under a key drawn at start-up, and the two 32-byte
/// digests are compared by `ring`'s constant-time comparison.
pub(crate) struct Secrets {
    key: ring::hmac::Key,
}

impl Default for Secrets {
    fn default() -> Self {
        Secrets {
            key: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &rand::random::<[u8; 32]>()),
        }
    }
}

impl Secrets {
    /// Whether `a` and `b` are the same secret.
    pub(crate) fn same(&self, a: &str, b: &str) -> bool {
        let tag = ring::hmac::sign(&self.key, a.as_bytes());
        ring::hmac::verify(&self.key, b.as_bytes(), tag.as_ref()).is_ok()
    }
}

/// A token bucket of login attempts, one for the whole console (not per
/// connection or address, so parallel guessing gains nothing): it holds at
/// most [`super::LOGIN_FAILURES_BURST`] and refills one every
/// [`super::LOGIN_FAILURE_REFILL`]. Every attempt takes one before the
/// credential is checked; a right one gives it back. When it is empty,
/// every attempt is refused (429) without being checked, so that the
/// answer tells nothing about the guess.
pub(crate) struct Limiter(Mutex<(f64, Instant)>);

impl Default for Limiter {
    fn default() -> Self {
        Limiter(Mutex::new((
            super::LOGIN_FAILURES_BURST as f64,
            Instant::now(),
        )))
    }
}

impl Limiter {
    /// Take one attempt; `Err(wait)` when there is none left.
    fn take(&self) -> Result<(), Duration> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, since) = &mut *g;
        let refill = super::LOGIN_FAILURE_REFILL.as_secs_f64();
        *tokens = (*tokens + since.elapsed().as_secs_f64() / refill)
            .min(super::LOGIN_FAILURES_BURST as f64);
        *since = Instant::now();
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - *tokens) * refill))
        }
    }

    /// Give back the attempt of a right credential.
    fn give_back(&self) {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.0 = (g.0 + 1.0).min(super::LOGIN_FAILURES_BURST as f64);
    }
}

fn cookie(app: &App, headers: &HeaderMap) -> Option<String> {
    let name = cookie_kind(app).0;
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.to_string())
}

/// The CSRF token of the request's session, when actions are on and it
/// comes from a logged-in browser: the pages show forms only then.
pub(crate) fn session(app: &App, headers: &HeaderMap) -> Option<String> {
    if !app.config.actions {
        return None;
    }
    app.sessions.csrf_of(&cookie(app, headers)?)
}

/// The CSRF token of a session on a read-only console (for its logout).
pub(crate) fn reader(app: &App, headers: &HeaderMap) -> Option<String> {
    if app.config.actions || !has_login(app) {
        return None;
    }
    app.sessions.csrf_of(&cookie(app, headers)?)
}

/// Whether the request comes from a logged-in browser (actions or not).
pub(crate) fn logged_in(app: &App, headers: &HeaderMap) -> bool {
    cookie(app, headers).is_some_and(|id| app.sessions.csrf_of(&id).is_some())
}

/// Whether this console has a login: with actions, or when reading needs
/// the credential (an address other than loopback).
pub(crate) fn has_login(app: &App) -> bool {
    app.config.actions || app.config.reads_need_login(app.bound)
}

/// Whether `host` (a `Host` header) names this console: an IP address on
/// its port (no name, so nothing to rebind), `localhost` on its port when
/// it listens on loopback or on every address, or a name given with
/// `--ui-host` (`NAME`: any port; `NAME:PORT`: that port).
pub(crate) fn host_allowed(host: &str, bound: SocketAddr, names: &[String]) -> bool {
    fn split(h: &str) -> (String, Option<&str>) {
        let h = h.trim();
        let (name, port) = if let Some(rest) = h.strip_prefix('[') {
            match rest.split_once(']') {
                Some((ip, tail)) => (ip, tail.strip_prefix(':')),
                None => (h, None),
            }
        } else {
            match h.rsplit_once(':') {
                Some((n, p)) if !n.contains(':') => (n, Some(p)),
                _ => (h, None),
            }
        };
        (name.trim_end_matches('.').to_ascii_lowercase(), port)
    }
    let (name, port) = split(host);
    if name.is_empty() {
        return false;
    }
    let own_port = match port {
        Some(p) => p.parse::<u16>().ok() == Some(bound.port()),
        None => bound.port() == 80,
    };
    if own_port && name.parse::<IpAddr>().is_ok() {
        return true;
    }
    let local = bound.ip().is_loopback() || bound.ip().is_unspecified();
    if own_port && local && name == "localhost" {
        return true;
    }
    names.iter().any(|n| {
        let (n, p) = split(n);
        n == name && (p.is_none() || p == port)
    })
}

/// Middleware in front of every route: the `Host` must name this console
/// (else 421, see [`host_allowed`]); and when reading needs a login, a
/// browser without a session is sent to the login form (`GET`) or refused
/// (401), except for the login form itself and the assets.
pub(crate) async fn gate(
    State(app): State<App>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    let Some(host) = host else {
        return PageError::BadRequest("the request has no Host header".into()).into_response();
    };
    if !host_allowed(&host, app.bound, &app.config.hosts) {
        // Debug, not warn: a hostile page can send these by the thousand.
        tracing::debug!(host = %host.escape_debug(), "console: refused a request for another host name");
        return PageError::MisdirectedHost(host).into_response();
    }
    let path = request.uri().path();
    let open = path == "/login" || path == "/favicon.ico" || path.starts_with("/assets/");
    if !open && app.config.reads_need_login(app.bound) && !logged_in(&app, request.headers()) {
        if request.method() == axum::http::Method::GET && path != "/fragment/overview" {
            // Back to this page after the login; to its path alone when
            // the whole of it would make the login's address too long.
            let whole = request.uri().path_and_query().map_or("/", |p| p.as_str());
            let here = if whole.len() <= 1024 { whole } else { path };
            return Redirect::to(&format!("/login?next={}", super::view::encode(here)))
                .into_response();
        }
        return PageError::Unauthorized.into_response();
    }
    next.run(request).await
}

/// A request from another site. Browsers say where a request comes from
/// in `Sec-Fetch-Site` (only `same-origin`, or `none` for one the user
/// typed, pass); without it, an `Origin` must be this console's. A request
/// with neither (a script, not a browser) still needs the session and the
/// CSRF token.
fn cross_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or_default();
        return !(site == "same-origin" || site == "none");
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    let origin = origin.to_str().unwrap_or_default();
    let bare = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    bare != Some(host) || host.is_empty()
}

/// Check a state-changing request: actions on (else 403), same origin
/// (else 403), a session (else 401) and its CSRF token (else 403).
pub(crate) fn authorize(app: &App, headers: &HeaderMap, csrf: &str) -> Result<(), PageError> {
    if !app.config.actions {
        return Err(PageError::Forbidden(
            "this console is read-only: start it with --ui-actions (and PGWAKE_UI_TOKEN) to act"
                .into(),
        ));
    }
    if cross_origin(headers) {
        return Err(PageError::Forbidden(
            "refused: the request came from another site".into(),
        ));
    }
    let Some(expected) = session(app, headers) else {
        return Err(PageError::Unauthorized);
    };
    if csrf.is_empty() || !app.secrets.same(&expected, csrf) {
        return Err(PageError::Forbidden(
            "refused: the form's CSRF token is missing or stale; reload the page and try again"
                .into(),
        ));
    }
    Ok(())
}

/// Check a logout: same origin (else 403), a session (else 401) and its
/// CSRF token (else 403); with or without actions.
fn check_session(app: &App, headers: &HeaderMap, csrf: &str) -> Result<(), PageError> {
    if cross_origin(headers) {
        return Err(PageError::Forbidden(
            "refused: the request came from another site".into(),
        ));
    }
    let Some(expected) = cookie(app, headers).and_then(|id| app.sessions.csrf_of(&id)) else {
        return Err(PageError::Unauthorized);
    };
    if csrf.is_empty() || !app.secrets.same(&expected, csrf) {
        return Err(PageError::Forbidden(
            "refused: the form's CSRF token is missing or stale; reload the page and try again"
                .into(),
        ));
    }
    Ok(())
}

/// The login form's fields.
#[derive(Deserialize)]
pub(crate) struct Login {
    #[serde(default)]
    token: String,
    #[serde(default)]
    next: String,
}

/// A local path to go back to: `/…`, never `//host` or a URL; else `/`.
/// Checked as given and once percent-decoded: a single leading `/`, no
/// second `/` after it, no backslash, no control character and no
/// whitespace (browsers strip tabs and newlines from a URL, so
/// `/\t/evil.example` would be `//evil.example`).
pub(crate) fn local_path(next: &str) -> &str {
    fn local(s: &str) -> bool {
        s.starts_with('/')
            && !s.starts_with("//")
            && !s.contains('\\')
            && !s.chars().any(|c| c.is_control() || c.is_whitespace())
    }
    let decoded = percent_encoding::percent_decode_str(next).decode_utf8_lossy();
    if local(next) && local(&decoded) {
        next
    } else {
        "/"
    }
}

/// `POST /login`: the credential → a session cookie, back to `next`.
pub(crate) async fn login(
    State(app): State<App>,
    headers: HeaderMap,
    Form(form): Form<Login>,
) -> Response {
    if !has_login(&app) {
        return PageError::Forbidden(
            "this console is read-only: there is nothing to log in to".into(),
        )
        .into_response();
    }
    if cross_origin(&headers) {
        return PageError::Forbidden("refused: the request came from another site".into())
            .into_response();
    }
    if let Err(wait) = app.limiter.take() {
        tracing::debug!("console: login refused, too many wrong credentials lately");
        return PageError::TooMany(wait).into_response();
    }
    let ok = app
        .config
        .token
        .as_deref()
        .is_some_and(|t| app.secrets.same(t, &form.token));
    if ok {
        app.limiter.give_back();
    } else {
        tracing::warn!("console: a login with a wrong credential");
        // A wrong credential costs a moment, so guessing is slow.
        tokio::time::sleep(Duration::from_millis(500)).await;
        return (
            StatusCode::UNAUTHORIZED,
            Html(login_markup(&app, local_path(&form.next), true)),
        )
            .into_response();
    }
    let (id, _) = app.sessions.create();
    let mut response = Redirect::to(local_path(&form.next)).into_response();
    let (name, secure) = cookie_kind(&app);
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{name}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
        SESSION_TTL.as_secs()
    )) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// The logout form's field.
#[derive(Deserialize)]
pub(crate) struct Logout {
    #[serde(default)]
    csrf: String,
}

/// `POST /logout`: end the session.
pub(crate) async fn logout(
    State(app): State<App>,
    headers: HeaderMap,
    Form(form): Form<Logout>,
) -> Response {
    if let Err(e) = check_session(&app, &headers, &form.csrf) {
        return e.into_response();
    }
    if let Some(id) = cookie(&app, &headers) {
        app.sessions.remove(&id);
    }
    let mut response = Redirect::to("/").into_response();
    let (name, secure) = cookie_kind(&app);
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{name}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0{secure}"
    )) {
        response.headers_mut().insert(header::SET_COOKIE, v);
    }
    response
}

/// The login form (`failed`: after a wrong credential).
pub(crate) fn login_markup(app: &App, next: &str, failed: bool) -> String {
    let body = html! {
        h1 { "Log in" }
        @if !has_login(app) {
            div.panel { p { "This console is read-only: it was started without --ui-actions, so there is nothing to log in to." } }
        } @else {
            @if failed { div.panel.error { p { "That is not the credential." } } }
            div.panel {
                form method="post" action="/login" {
                    input type="hidden" name="next" value=(next);
                    label { "Credential (the PGWAKE_UI_TOKEN the console was started with)"
                        input #token type="password" name="token" autocomplete="current-password" autofocus; }
                    p { button.primary type="submit" { "Log in" } }
                }
            }
        }
    };
    page("Log in", "", Who::Plain(app.config.actions), body).into_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(local_path("/jobs?queue=a"), "/jobs?queue=a");
        assert_eq!(local_path("/jobs/42?did=retried"), "/jobs/42?did=retried");
        for bad in [
            "//evil.example",
            "https://evil.example/",
            "/\\evil",
            "jobs",
            "",
            // Browsers strip tabs and newlines from a URL: `/\t/evil.example`
            // is `//evil.example`, another site.
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r/evil.example",
            "/%09/evil.example",
            "/%0a/evil.example",
            "/%2F/evil.example",
            "/%5Cevil.example",
            "/ /evil.example",
            "/%20/evil.example",
            "/\u{0}x",
        ] {
            assert_eq!(local_path(bad), "/", "{bad}");
        }
    }

    #[test]
    fn other_sites_are_recognised() {
        let mut h = HeaderMap::new();
        h.insert(header::HOST, HeaderValue::from_static("127.0.0.1:9190"));
        assert!(!cross_origin(&h), "no Origin: a script, not a browser");
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://127.0.0.1:9190"),
        );
        assert!(!cross_origin(&h));
        h.insert(
            header::ORIGIN,
            HeaderValue::from_static("http://evil.example"),
        );
        assert!(cross_origin(&h));
        h.insert(header::ORIGIN, HeaderValue::from_static("null"));
        assert!(cross_origin(&h));
        h.insert("sec-fetch-site", HeaderValue::from_static("same-origin"));
        assert!(!cross_origin(&h), "a browser's own word wins");
        h.insert("sec-fetch-site", HeaderValue::from_static("cross-site"));
        assert!(cross_origin(&h));
    }

    #[test]
    fn secrets_compare_whole() {
        let s = Secrets::default();
        assert!(s.same("abc", "abc"));
        assert!(!s.same("abc", "abd"));
        assert!(!s.same("abc", "ab"));
        assert!(!s.same("", "a"));
        assert!(s.same("", ""));
    }

    #[test]
    fn the_login_bucket_empties_and_gives_back() {
        let l = Limiter::default();
        for _ in 0..super::super::LOGIN_FAILURES_BURST {
            assert!(l.take().is_ok());
        }
        let wait = l.take().unwrap_err();
        assert!(wait <= super::super::LOGIN_FAILURE_REFILL, "{wait:?}");
        l.give_back();
        assert!(l.take().is_ok());
        assert!(l.take().is_err());
    }
}
