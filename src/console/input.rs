//! The bounds on everything the console accepts, checked before any
//! handler reads it: the path's and the query string's length, the form's
//! size, how many fields, each field's length, no control character and
//! only valid UTF-8, a job id that is a number, and (in
//! [`super::pages::payload_filter`]) the payload path's depth. Input out of
//! bounds is answered 400 with a page that says which bound, never passed
//! on to the database or a recursive structure.
//!
//! [`Query`] and [`Form`] replace axum's extractors of the same names, so
//! that a malformed, repeated or out-of-range field is also a 400 page (not
//! axum's plain-text 400/422).

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;

use super::error::PageError;

/// Longest URL path accepted, in bytes.
pub const PATH_MAX: usize = 1024;
/// Longest query string accepted, in bytes (percent-encoded).
pub const QUERY_MAX: usize = 8 * 1024;
/// Largest form body accepted, in bytes.
pub const FORM_MAX: usize = 16 * 1024;
/// Most fields in a query string or a form.
pub const FIELDS_MAX: usize = 32;
/// Longest field value (and name) accepted, in characters after decoding.
pub const VALUE_MAX: usize = 1024;
/// Most segments of a payload filter's path (`a.b.c=1` has 3).
pub const PAYLOAD_DEPTH_MAX: usize = 16;

/// Middleware: refuse a path or query string longer than [`PATH_MAX`] or
/// [`QUERY_MAX`] before routing.
pub(crate) async fn bounds(request: Request, next: Next) -> Response {
    let uri = request.uri();
    if uri.path().len() > PATH_MAX {
        return PageError::BadRequest(format!(
            "the address's path is {} bytes long: at most {PATH_MAX} are accepted",
            uri.path().len()
        ))
        .into_response();
    }
    let query = uri.query().unwrap_or("").len();
    if query > QUERY_MAX {
        return PageError::BadRequest(format!(
            "the query string is {query} bytes long: at most {QUERY_MAX} are accepted \
             (shorten the filters)"
        ))
        .into_response();
    }
    next.run(request).await
}

/// Check the fields of a query string or form body, then read them as `T`.
fn fields<T: DeserializeOwned>(raw: &[u8], what: &str) -> Result<T, PageError> {
    let bad = |m: String| PageError::BadRequest(format!("{what}: {m}"));
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_bytes(raw).map_err(|e| bad(e.to_string()))?;
    if pairs.len() > FIELDS_MAX {
        return Err(bad(format!(
            "{} fields: at most {FIELDS_MAX} are accepted",
            pairs.len()
        )));
    }
    for (name, value) in &pairs {
        // The name as shown: its first characters, control characters
        // escaped (the page escapes the rest).
        let shown = || format!("{:?}", name.chars().take(40).collect::<String>());
        for (s, which) in [(name, "name"), (value, "value")] {
            if s.chars().count() > VALUE_MAX {
                return Err(bad(format!(
                    "the {which} of field {} is longer than {VALUE_MAX} characters",
                    shown()
                )));
            }
            if let Some(c) = s.chars().find(|c| c.is_control()) {
                return Err(bad(format!(
                    "the {which} of field {} holds the control character U+{:04X}",
                    shown(),
                    c as u32
                )));
            }
            if s.contains('\u{FFFD}') {
                return Err(bad(format!(
                    "the {which} of field {} is not valid UTF-8",
                    shown()
                )));
            }
        }
    }
    serde_urlencoded::from_bytes(raw).map_err(|e| bad(e.to_string()))
}

/// The query string as `T`, within the bounds (else a 400 page).
pub(crate) struct Query<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, PageError> {
        let q = parts.uri.query().unwrap_or("");
        if q.len() > QUERY_MAX {
            return Err(PageError::BadRequest(format!(
                "the query string is longer than {QUERY_MAX} bytes"
            )));
        }
        fields(q.as_bytes(), "the query string").map(Query)
    }
}

/// The form body as `T`, within the bounds (else a 400 page).
pub(crate) struct Form<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Form<T> {
    type Rejection = PageError;

    async fn from_request(req: Request, _: &S) -> Result<Self, PageError> {
        let body = axum::body::to_bytes(req.into_body(), FORM_MAX)
            .await
            .map_err(|_| {
                PageError::BadRequest(format!(
                    "the form is larger than {FORM_MAX} bytes, or was cut short"
                ))
            })?;
        fields(&body, "the form").map(Form)
    }
}

/// The job id of `/jobs/{id}`: a whole number (else a 400 page).
pub(crate) struct JobId(pub i64);

impl<S: Send + Sync> FromRequestParts<S> for JobId {
    type Rejection = PageError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, PageError> {
        // `/jobs/{id}` and `/jobs/{id}/…`: the second segment.
        let raw = parts.uri.path().split('/').nth(2).unwrap_or("");
        raw.parse::<i64>().map(JobId).map_err(|_| {
            PageError::BadRequest(format!(
                "job id {:?} is not a whole number",
                raw.chars().take(40).collect::<String>()
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct F {
        #[serde(default)]
        a: String,
        #[serde(default)]
        n: Option<i64>,
    }

    fn read(raw: &str) -> Result<F, String> {
        fields::<F>(raw.as_bytes(), "q").map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn fields_out_of_bounds_are_refused_naming_the_bound() {
        assert_eq!(read("a=x&n=3").unwrap().n, Some(3));
        assert_eq!(read("a=%C3%BC").unwrap().a, "ü");
        for (raw, says) in [
            ("a=x%00y", "U+0000"),
            ("a=%1B%5B31m", "U+001B"),
            ("a=%FF", "UTF-8"),
            ("a=1&a=2", "duplicate"),
            ("n=99999999999999999999", "n"),
            ("n=x", "n"),
        ] {
            let e = read(raw).unwrap_err();
            assert!(e.contains(says), "{raw}: {e}");
        }
        let long = format!("a={}", "x".repeat(VALUE_MAX + 1));
        assert!(read(&long).unwrap_err().contains("longer than"));
        let many: Vec<String> = (0..=FIELDS_MAX).map(|i| format!("k{i}=v")).collect();
        assert!(read(&many.join("&")).unwrap_err().contains("fields"));
    }
}
