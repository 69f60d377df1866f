//! The pages' frame (header, navigation, the embedded stylesheet and
//! script), the security headers of every response, and small formatting
//! helpers. Every value goes through `maud`, which escapes it.

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use maud::{html, Markup, DOCTYPE};

use crate::admin::stats::is_bidi_control;

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// `GET /assets/favicon.svg` and `GET /favicon.ico`: the console's icon,
/// served by itself (nothing from another site).
pub(crate) async fn favicon() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "image/svg+xml")], FAVICON)
}

/// `GET /assets/console.css`.
pub(crate) async fn css() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/css; charset=utf-8")], CSS)
}

/// `GET /assets/console.js`.
pub(crate) async fn js() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        JS,
    )
}

/// On every response: nothing but this console's own files may load or
/// run (no inline script, no other site), no framing, no caching, no
/// referrer sent to another site; and no bidirectional-text control in a
/// page ([`visible_bidi`]).
pub(crate) async fn secure_headers(response: Response) -> Response {
    let mut response = visible_bidi(response).await;
    let h = response.headers_mut();
    for (name, value) in [
        (
            "content-security-policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        ("referrer-policy", "same-origin"),
        ("cache-control", "no-store"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A page with every bidirectional-text control (a right-to-left override,
/// an isolate: Trojan Source) shown as its escape, `\u{202e}`, the way the
/// command line shows them. They can only come from producers (task, queue
/// and key names, payloads, errors, sessions' statements); raw, they would
/// reorder what the operator reads. `maud` escapes markup, not these; one
/// pass over every HTML response covers every page, fragment and form.
/// A page holding none (the usual case) is passed on as it is.
async fn visible_bidi(response: Response) -> Response {
    let html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    if !html {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    // The console's pages are bounded (lists paged, values cut), so whole.
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(_) => return axum::http::StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let text = match std::str::from_utf8(&bytes) {
        Ok(text) if text.chars().any(is_bidi_control) => text,
        _ => return Response::from_parts(parts, axum::body::Body::from(bytes)),
    };
    let mut out = String::with_capacity(text.len() + 32);
    for c in text.chars() {
        if is_bidi_control(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(out))
}

/// The navigation's pages: path and title.
const NAV: &[(&str, &str)] = &[
    ("/", "Overview"),
    ("/jobs", "Jobs"),
    ("/queues", "Queues"),
    ("/schedules", "Schedules"),
    ("/workers", "Workers"),
];

/// What the header shows about the operator.
pub(crate) enum Who<'a> {
    /// Read-only console.
    ReadOnly,
    /// Actions on, not logged in; the path to come back to.
    LoggedOut(&'a str),
    /// Logged in, with the session's CSRF token.
    LoggedIn(&'a str),
    /// Read-only console, logged in to read (an address other than
    /// loopback), with the session's CSRF token for the logout.
    Reader(String),
    /// A page that knows only whether actions are on (the login form, an
    /// error).
    Plain(bool),
}

/// A whole page.
pub(crate) fn page(title: &str, here: &str, who: Who<'_>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="same-origin";
                title { (title) " · pgwake" }
                link rel="icon" type="image/svg+xml" href="/assets/favicon.svg";
                link rel="stylesheet" href="/assets/console.css";
                script src="/assets/console.js" defer {}
            }
            body {
                header.top {
                    a.brand href="/" { "pgwake" }
                    nav {
                        @for (path, name) in NAV {
                            a href=(path) class=[(*path == here).then_some("here")] { (name) }
                        }
                    }
                    div.who {
                        @match who {
                            Who::ReadOnly | Who::Plain(false) => span.badge.b-muted #actions title="actions are off: start the console with --ui-actions to act" { "read-only" },
                            Who::Plain(true) => span.badge.b-ok #actions title="this console was started with --ui-actions: log in to act" { "actions on" },
                            Who::LoggedOut(next) => {
                                span.badge.b-ok #actions title="this console was started with --ui-actions: log in to act" { "actions on" }
                                a href={ "/login?next=" (encode(next)) } { "Log in to act" }
                            },
                            Who::Reader(csrf) => {
                                span.badge.b-muted #actions title="actions are off: start the console with --ui-actions to act" { "read-only" }
                                form.inline method="post" action="/logout" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button type="submit" { "Log out" }
                                }
                            },
                            Who::LoggedIn(csrf) => {
                                span.badge.b-ok #actions title="logged in: the forms act" { "actions on" }
                                form.inline method="post" action="/logout" {
                                    input type="hidden" name="csrf" value=(csrf);
                                    button type="submit" { "Log out" }
                                }
                            },
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// Percent-encode a query value.
pub(crate) fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A duration in seconds, short: `850 ms`, `42 s`, `3 min`, `5 h`, `2 d`.
pub(crate) fn seconds(s: f64) -> String {
    let s = s.max(0.0);
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.0} h", s / 3600.0)
    } else {
        format!("{:.0} d", s / 86_400.0)
    }
}

/// An instant relative to now: `12 s ago`, `in 3 min`.
pub(crate) fn relative(t: chrono::DateTime<chrono::Utc>) -> String {
    let d = (chrono::Utc::now() - t).num_milliseconds() as f64 / 1000.0;
    if d >= 0.0 {
        format!("{} ago", seconds(d))
    } else {
        format!("in {}", seconds(-d))
    }
}

/// An RFC 3339 instant as relative text with the exact instant as its
/// tooltip.
pub(crate) fn when(t: Option<&str>) -> Markup {
    match t {
        None => html! { span.muted { "—" } },
        Some(s) => match chrono::DateTime::parse_from_rfc3339(s) {
            Ok(t) => {
                html! { time datetime=(s) title=(s) { (relative(t.with_timezone(&chrono::Utc))) } }
            }
            Err(_) => html! { (s) },
        },
    }
}

/// A timestamp as relative text with its exact value as tooltip.
pub(crate) fn at(t: Option<chrono::DateTime<chrono::Utc>>) -> Markup {
    when(t.map(|t| t.to_rfc3339()).as_deref())
}

/// A count with thousands separators.
pub(crate) fn count(n: i64) -> String {
    let s = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// A job state's badge colour.
pub(crate) fn state_class(state: &str) -> &'static str {
    match state {
        "waiting" => "badge b-info",
        "scheduled" => "badge b-muted",
        "running" => "badge b-ok",
        "buffered" => "badge b-info",
        "done" => "badge b-ok",
        "dead" => "badge b-bad",
        "cancelled" => "badge b-warn",
        _ => "badge b-muted",
    }
}

/// A reason's badge colour (`pgwake.explain`).
pub(crate) fn reason_class(reason: &str) -> &'static str {
    match reason {
        "ready" | "running" => "badge b-ok",
        "scheduled" | "snoozed" | "sleeping" | "waiting_for_signal" | "retry_backoff"
        | "buffered" | "progress" => "badge b-info",
        "paused"
        | "max_running"
        | "rate_limit"
        | "ordering_key"
        | "cancelled"
        | "saturated"
        | "locked"
        | "process_wait"
        | "waiting_for_parents" => "badge b-warn",
        _ => "badge b-bad",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_durations_read_well() {
        assert_eq!(count(0), "0");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(-1000), "-1,000");
        assert_eq!(seconds(0.25), "250 ms");
        assert_eq!(seconds(42.0), "42 s");
        assert_eq!(seconds(600.0), "10 min");
    }

    #[test]
    fn values_are_escaped() {
        let out = page(
            "<script>",
            "/",
            Who::ReadOnly,
            html! { p { ("\"'><img src=x onerror=alert(1)>") } },
        )
        .into_string();
        assert!(!out.contains("<img src=x"), "{out}");
        assert!(out.contains("&lt;img src=x"), "{out}");
        assert!(out.contains("&lt;script&gt; · pgwake"), "{out}");
    }
}
