//! Every limit in words, over plain HTTP (issue 38, item 1): the per-key
//! settings of each queue on the overview and the Queues page, set by the
//! same CSRF-checked forms as max-running; each job's limit key and why it
//! waits, in words with the machine name in the tooltip; hostile queue
//! and key names escaped.

use crate::common::*;
use crate::support::*;

use pgwake::admin::queues;

/// A queue name and a limit key a producer could choose to break out of
/// the page (quotes, markup, non-ASCII).
pub const QUEUE: &str = "<script>window.pwned=1</script>q\"'ü";
pub const KEY: &str = "\"'><img src=x onerror=\"window.pwned=1\">acmé";

async fn settings(c: &tokio_postgres::Client, queue: &str) -> queues::QueueSettings {
    queues::list(c)
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.queue == queue)
        .expect("the queue has settings")
}

/// The raw markup a hostile name must never appear as.
fn assert_escaped(path: &str, body: &str) {
    for raw in ["<script>window", "<img src=x", "onerror=\"window"] {
        assert!(!body.contains(raw), "{path} holds {raw}: {body}");
    }
}

#[tokio::test]
async fn per_key_limits_show_on_the_overview_and_the_queues_page() {
    let db = migrated_db().await;
    let c = db.client().await;
    queues::set_limit_key_path(&c, QUEUE, Some("customer\"<b>"))
        .await
        .unwrap();
    queues::set_max_running_per_key(&c, QUEUE, Some(2))
        .await
        .unwrap();
    queues::set_rate_per_key(&c, QUEUE, Some("5/min".parse().unwrap()))
        .await
        .unwrap();
    queues::set_fair_keys(&c, QUEUE, true).await.unwrap();
    queues::set_key_max_running(&c, QUEUE, KEY, Some(7))
        .await
        .unwrap();
    let console = Console::start(&db, false).await;
    for path in ["/", "/queues"] {
        let body = get(&console, path).await.body;
        assert_escaped(path, &body);
        for shown in [
            "Limit keys",
            "key: payload field <code>customer&quot;&lt;b&gt;</code>",
            "2 running per key",
            "5/min per key",
            "fair between keys",
            "own limits: <code>&quot;&#39;&gt;&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;acmé</code> 7",
        ] {
            // maud writes ' as is in text; accept either.
            let alt = shown.replace("&#39;", "'");
            assert!(
                body.contains(shown) || body.contains(&alt),
                "{path} lacks {shown}: {body}"
            );
        }
    }
    // A queue without key settings says so.
    queues::set_max_running(&c, "plain", Some(3)).await.unwrap();
    let body = get(&console, "/queues").await.body;
    assert!(body.contains("no per-key limit"), "{body}");
}

#[tokio::test]
async fn the_queues_page_sets_per_key_limits_with_the_session_and_its_csrf_token() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.execute(
        "SELECT pgwake.enqueue('t', queue => $1, run_at => now() + interval '1 hour')",
        &[&QUEUE],
    )
    .await
    .unwrap();
    let console = Console::start(&db, true).await;
    let (cookie, csrf) = login(&console, TOKEN).await.unwrap();
    let queues_page = http(console.addr, "GET", "/queues", &[("Cookie", &cookie)], None).await;
    assert!(
        queues_page.body.contains("name=\"max_running_per_key\"")
            && queues_page.body.contains("name=\"key_max_running\""),
        "the forms are there: {}",
        queues_page.body
    );
    assert_escaped("/queues", &queues_page.body);
    let keys_form = |csrf: &str, per_key: &str, rate: &str, fair: bool, path: &str| {
        format!(
            "csrf={}&queue={}&op=keys&limit_key_path={}&max_running_per_key={per_key}&rate_per_key={}{}",
            encode(csrf),
            encode(QUEUE),
            encode(path),
            encode(rate),
            if fair { "&fair_keys=on" } else { "" }
        )
    };
    // Without the CSRF token: refused, nothing set.
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&keys_form("", "2", "5/s", true, "customer")),
    )
    .await;
    assert_eq!(r.status, 403, "{}", r.body);
    let s = queues::list(&c).await.unwrap();
    assert!(
        s.iter()
            .all(|q| q.max_running_per_key.is_none() && !q.fair_keys),
        "{s:?}"
    );
    // With it: every per-key setting at once.
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&keys_form(&csrf, "2", "5/s", true, "customer")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let s = settings(&c, QUEUE).await;
    assert_eq!(s.limit_key_path.as_deref(), Some("customer"));
    assert_eq!(s.max_running_per_key, Some(2));
    assert_eq!(
        s.rate_per_key.map(|r| r.to_string()).as_deref(),
        Some("5/s")
    );
    assert!(s.fair_keys);
    // One key's own limit, then back to the per-key limit.
    let key_form = |n: &str| {
        format!(
            "csrf={}&queue={}&op=key_limit&key={}&key_max_running={n}",
            encode(&csrf),
            encode(QUEUE),
            encode(KEY)
        )
    };
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&key_form("9")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(settings(&c, QUEUE).await.key_max_running.get(KEY), Some(&9));
    let page = http(console.addr, "GET", "/queues", &[("Cookie", &cookie)], None).await;
    assert_escaped("/queues", &page.body);
    assert!(page.body.contains("acmé</code> 9"), "{}", page.body);
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&key_form("")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert!(settings(&c, QUEUE).await.key_max_running.is_empty());
    // Bad input names the fix and changes nothing.
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&keys_form(&csrf, "two", "", false, "")),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("max running per key"), "{}", r.body);
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&keys_form(&csrf, "", "5/fortnight", false, "")),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("N/s"), "{}", r.body);
    assert_eq!(settings(&c, QUEUE).await.max_running_per_key, Some(2));
    // Empty fields and an unticked box remove every per-key setting.
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&keys_form(&csrf, "", "", false, "")),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let s = settings(&c, QUEUE).await;
    assert_eq!(
        (
            s.limit_key_path,
            s.max_running_per_key,
            s.rate_per_key,
            s.fair_keys
        ),
        (None, None, None, false)
    );
}
