//! Who may act: with `--ui-actions`, an operator logs in with the
//! credential (`PGWAKE_UI_TOKEN`) and gets a session cookie (`HttpOnly`,
//! `SameSite=Strict`); every state-changing request must carry that cookie,
//! the session's CSRF token (a hidden field of every form) and, when the
//! browser sends one, an `Origin` of this console. Without `--ui-actions`
//! every POST is refused. Sessions live in memory: a restart logs everyone
//! out.

use std::collections::HashMap;
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

fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

/// The CSRF token of the request's session, when actions are on and it
/// comes from a logged-in browser: the pages show forms only then.
pub(crate) fn session(app: &App, headers: &HeaderMap) -> Option<String> {
    if !app.config.actions {
        return None;
    }
    app.sessions.csrf_of(&cookie(headers)?)
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
    if !app.config.actions {
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
        tracing::warn!("console: login refused, too many wrong credentials lately");
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
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
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
    if let Err(e) = authorize(&app, &headers, &form.csrf) {
        return e.into_response();
    }
    if let Some(id) = cookie(&headers) {
        app.sessions.remove(&id);
    }
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("pgwake_console=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"),
    );
    response
}

/// The login form (`failed`: after a wrong credential).
pub(crate) fn login_markup(app: &App, next: &str, failed: bool) -> String {
    let body = html! {
        h1 { "Log in" }
        @if !app.config.actions {
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
    page("Log in", "", Who::ReadOnly, body).into_string()
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
