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
