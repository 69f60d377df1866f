//! What a page shows when it cannot show itself: the status and a message
//! for the operator (never a connection string or host: connection errors
//! go to the log).

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::html;

use super::view::{page, Who};
use crate::admin::schedules;
use crate::error::Error;

tokio::task_local! {
    /// Whether the console serving this request has actions on, for the
    /// header of an error page (which is made without the console's state).
    static ACTIONS: bool;
}

/// Around every request: remember whether actions are on while it is
/// answered, so that an error page's header says it as every page does.
pub(crate) async fn with_actions(
    axum::extract::State(app): axum::extract::State<super::App>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    ACTIONS.scope(app.config.actions, next.run(request)).await
}

/// Why a page could not be shown.
#[derive(Debug)]
pub(crate) enum PageError {
    /// The database failed or refused.
    Db(Error),
    /// Bad input (a message for the operator).
    BadRequest(String),
    /// No such thing.
    NotFound(String),
    /// Not allowed (read-only console, another site, a stale CSRF token).
    Forbidden(String),
    /// Actions need a login.
    Unauthorized,
    /// The `Host` header names another host (DNS rebinding?).
    MisdirectedHost(String),
    /// Too many wrong credentials lately: try again after this long.
    TooMany(std::time::Duration),
}

impl From<Error> for PageError {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(m) => PageError::BadRequest(m),
            // A data exception (SQLSTATE class 22: a value out of range, an
            // invalid text representation) is the input's fault, not the
            // database's: the server's message, as a 400.
            Error::Db { context, source }
                if source.code().is_some_and(|c| c.code().starts_with("22")) =>
            {
                let message = source
                    .as_db_error()
                    .map(|d| d.message().to_string())
                    .unwrap_or_default();
                PageError::BadRequest(format!("{context}: {message}"))
            }
            e => PageError::Db(e),
        }
    }
}

impl From<schedules::ScheduleError> for PageError {
    fn from(e: schedules::ScheduleError) -> Self {
        match e {
            schedules::ScheduleError::Db(e) => e.into(),
            schedules::ScheduleError::NotFound(_) => PageError::NotFound(e.to_string()),
            other => PageError::BadRequest(other.to_string()),
        }
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let mut retry_after = None;
        let (status, message) = match self {
            PageError::Db(e) => {
                tracing::warn!(error = %e, "console: a page failed");
                // The server's own message only (a permission, a timeout):
                // connection errors could name hosts, so they are not shown.
                let shown = match &e {
                    Error::Db { context, source } => match source.as_db_error() {
                        Some(db) => format!("{context}: {}", db.message()),
                        None => format!(
                            "{context}: the database connection failed (see the console's log)"
                        ),
                    },
                    _ => "the database is unavailable (see the console's log)".to_string(),
                };
                (StatusCode::SERVICE_UNAVAILABLE, shown)
            }
            PageError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            PageError::NotFound(m) => (StatusCode::NOT_FOUND, m),
            PageError::Forbidden(m) => (StatusCode::FORBIDDEN, m),
            PageError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "log in first (Log in to act, at the top right)".to_string(),
            ),
            PageError::MisdirectedHost(host) => (
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "This console does not answer to the host name {:?}: a page of another \
                     site whose name now leads here must not read it (DNS rebinding). If you \
                     reach the console by that name, start it with --ui-host {} \
                     (repeatable; NAME for any port, NAME:PORT for one).",
                    host.chars().take(200).collect::<String>(),
                    host.chars().take(200).collect::<String>().escape_debug()
                ),
            ),
            PageError::TooMany(wait) => {
                let secs = wait.as_secs().max(1);
                retry_after = Some(secs);
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "Too many wrong credentials lately: no login is checked for {secs} s. \
                         Sessions already logged in keep working."
                    ),
                )
            }
        };
        let body = html! {
            h1 { (status.canonical_reason().unwrap_or("Error")) }
            div.panel.error { p { (message) } }
            p { a href="/" { "Back to the overview" } }
        };
        let mut response = (
            status,
            Html(
                page(
                    "Error",
                    "",
                    Who::Plain(ACTIONS.try_with(|a| *a).unwrap_or(false)),
                    body,
                )
                .into_string(),
            ),
        )
            .into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// A page's result.
pub(crate) type PageResult = Result<Response, PageError>;
