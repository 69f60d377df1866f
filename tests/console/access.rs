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
