//! The Jobs page and a job's actions over plain HTTP (issue 38, item 1):
//! counts per state above the table, a confirmation before cancelling a
//! running job, post-redirect-get after a bulk action, the favicon, and
//! a wrong credential or an error answered as a page whose header says
//! whether actions are on.

use crate::common::*;
use crate::limits::{key_at_its_limit, KEY, QUEUE};
use crate::support::*;

/// The text of the first element with `attr` in `body`, tags dropped.
fn inner(body: &str, attr: &str) -> String {
    let at = body
        .find(attr)
        .unwrap_or_else(|| panic!("no {attr}: {body}"));
    let rest = &body[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find("</div>").unwrap() + start;
    let mut out = String::new();
    let mut tag = false;
    for ch in rest[start..end].chars() {
        match ch {
            '<' => tag = true,
            '>' => tag = false,
            c if !tag => out.push(c),
            _ => {}
        }
    }
    out
}

#[tokio::test]
async fn the_jobs_page_counts_jobs_per_state_above_the_table() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.execute(
        "SELECT pgwake.enqueue('t', queue => $1) FROM generate_series(1, 3)",
        &[&QUEUE],
    )
    .await
    .unwrap();
    c.batch_execute(
        "SELECT pgwake.enqueue('t', queue => 'other', run_at => now() + interval '1 hour')
           FROM generate_series(1, 2);
         SELECT pgwake.enqueue('t', queue => 'other');
         UPDATE pgwake.jobs SET attempts = 1 WHERE id = (SELECT min(id) FROM pgwake.jobs WHERE queue = 'other');",
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let every = inner(&get(&console, "/jobs").await.body, "id=\"state-counts\"");
    assert!(every.starts_with("Every queue"), "{every}");
    for shown in [
        "waiting 4",
        "scheduled 2 (1 retrying)",
        "running 0",
        "dead or cancelled 0",
    ] {
        assert!(every.contains(shown), "{shown}: {every}");
    }
    let page = get(&console, &format!("/jobs?queue={}&task=t", encode(QUEUE)))
        .await
        .body;
    assert!(!page.contains("<script>window"), "{page}");
    let one = inner(&page, "id=\"state-counts\"");
    assert!(
        one.contains("waiting 3") && one.contains("scheduled 0"),
        "{one}"
    );
    assert!(one.contains("the other filters are not counted"), "{one}");
    // Each count leads to its state, of that queue.
    assert!(
        page.contains(&format!(
            "href=\"/jobs?queue={}&amp;state=waiting\"",
            pgwake_encode(QUEUE)
        )),
        "{page}"
    );
}

/// As the console percent-encodes a query value.
fn pgwake_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn cancelling_a_running_job_asks_first_and_a_waiting_one_does_not() {
    let db = migrated_db().await;
    let (w, held) = key_at_its_limit(&db).await;
    let c = db.client().await;
    let running: i64 = db
        .scalar("SELECT min(id) FROM pgwake.leased_jobs WHERE task = 'sleepy'")
        .await;
    let console = Console::start(&db, true).await;
    let (cookie, csrf) = login(&console, TOKEN).await.unwrap();
    let cancel =
        |id: i64, confirm: &str| format!("csrf={}&id={id}&op=cancel{confirm}", encode(&csrf));
    let post = |form: String| {
        let cookie = cookie.clone();
        let addr = console.addr;
        async move {
            http(
                addr,
                "POST",
                "/actions/job",
                &[("Cookie", &cookie)],
                Some(&form),
            )
            .await
        }
    };
    // Running: the confirmation page, with its own CSRF-checked form.
    let r = post(cancel(running, "")).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("id=\"confirm-cancel\""), "{}", r.body);
    assert!(
        r.body.contains("name=\"confirm\" value=\"yes\""),
        "{}",
        r.body
    );
    assert!(r.body.contains(&format!("name=\"csrf\" value=\"{csrf}\"")));
    let leased: i64 = db
        .scalar("SELECT count(*) FROM pgwake.leased_jobs WHERE task = 'sleepy'")
        .await;
    assert_eq!(leased, 2, "nothing is cancelled before the confirmation");
    // The confirmation without the CSRF token is refused.
    let r = post(format!("id={running}&op=cancel&confirm=yes")).await;
    assert_eq!(r.status, 403, "{}", r.body);
    // Confirmed: the worker stops it.
    let r = post(cancel(running, "&confirm=yes")).await;
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(
        r.header("location"),
        Some(format!("/jobs/{running}?did=cancel_requested").as_str())
    );
    eventually("cancelled", std::time::Duration::from_secs(60), || async {
        c.query(
            "SELECT 1 FROM pgwake.dead_jobs WHERE id = $1 AND last_error = 'cancelled'",
            &[&running],
        )
        .await
        .unwrap()
        .len()
            == 1
    })
    .await;
    // A job that waits is cancelled at once (the worker may have started
    // the held one by now, when the cancelled one freed its key's slot:
    // enqueue one that waits for sure).
    let _ = held;
    let later: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('sleepy', queue => $1, limit_key => $2, run_at => now() + interval '1 hour')",
            &[&QUEUE, &KEY],
        )
        .await
        .unwrap()
        .get(0);
    let r = post(cancel(later, "")).await;
    assert_eq!(r.status, 303, "{}", r.body);
    let gone: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = {later} AND last_error = 'cancelled'"
        ))
        .await;
    assert_eq!(gone, 1);
    w.stop.cancel();
    w.abort.cancel();
    let _ = w.join.await;
}

#[tokio::test]
async fn a_bulk_action_redirects_to_the_jobs_page_which_says_what_changed() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.execute(
        "SELECT pgwake.enqueue('t', queue => $1, run_at => now() + interval '1 hour')
         FROM generate_series(1, 2)",
        &[&QUEUE],
    )
    .await
    .unwrap();
    let console = Console::start(&db, true).await;
    let (cookie, csrf) = login(&console, TOKEN).await.unwrap();
    let r = http(
        console.addr,
        "POST",
        "/bulk/apply",
        &[("Cookie", &cookie)],
        Some(&format!(
            "csrf={}&action=cancel&queue={}&state=scheduled",
            encode(&csrf),
            encode(QUEUE)
        )),
    )
    .await;
    assert_eq!(r.status, 303, "post, redirect, get: {}", r.body);
    let to = r.header("location").unwrap().to_string();
    assert!(to.starts_with("/jobs?queue="), "{to}");
    assert!(to.ends_with("&did=bulk_cancel&changed=2"), "{to}");
    let page = http(console.addr, "GET", &to, &[("Cookie", &cookie)], None).await;
    assert_eq!(page.status, 200);
    assert!(!page.body.contains("<script>window"), "{}", page.body);
    let done = inner(&page.body, "id=\"bulk-done\"");
    assert!(done.starts_with("cancel: 2 job(s) changed"), "{done}");
    // Reloading it changes nothing more, and a made-up notice shows nothing.
    let odd = get(&console, "/jobs?did=bulk_%3Cscript%3E&changed=9")
        .await
        .body;
    assert!(!odd.contains("bulk-done"), "{odd}");
}

#[tokio::test]
async fn the_favicon_is_served_by_the_console_and_errors_are_pages_that_say_whether_actions_are_on()
{
    let db = migrated_db().await;
    let console = Console::start(&db, true).await;
    for path in ["/favicon.ico", "/assets/favicon.svg"] {
        let r = get(&console, path).await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.header("content-type"), Some("image/svg+xml"), "{path}");
        assert!(r.body.contains("<svg"), "{path}");
    }
    let page = get(&console, "/jobs").await.body;
    assert!(
        page.contains("<link rel=\"icon\" type=\"image/svg+xml\" href=\"/assets/favicon.svg\">"),
        "{page}"
    );
    // A wrong credential: a whole HTML page, its header says actions are on.
    let r = http(
        console.addr,
        "POST",
        "/login",
        &[],
        Some("token=wrong-credential-0000&next=%2F"),
    )
    .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(
        r.body.trim_start().starts_with("<!DOCTYPE html>"),
        "{}",
        r.body
    );
    assert!(r.body.contains("That is not the credential"), "{}", r.body);
    assert!(r.body.contains("id=\"actions\""), "{}", r.body);
    assert!(r.body.contains(">actions on<"), "{}", r.body);
    // Every other page too, an error's included.
    for path in ["/", "/jobs", "/no-such-page", "/jobs/999999"] {
        let r = get(&console, path).await;
        assert!(r.body.contains(">actions on<"), "{path}: {}", r.body);
        assert!(!r.body.contains(">read-only<"), "{path}: {}", r.body);
    }
    let read_only = Console::start(&db, false).await;
    for path in ["/", "/no-such-page", "/login"] {
        let r = get(&read_only, path).await;
        assert!(r.body.contains(">read-only<"), "{path}: {}", r.body);
        assert!(!r.body.contains(">actions on<"), "{path}: {}", r.body);
    }
}

/// The part of `body` from the element with `attr` to the end of its table.
fn table_at(body: &str, attr: &str) -> String {
    let at = body
        .find(attr)
        .unwrap_or_else(|| panic!("no {attr}: {body}"));
    let end = body[at..].find("</table>").unwrap() + at;
    body[at..end].to_string()
}

/// A flow a → m, b → m, m → s (s runs whatever m's end), with `a` ended
/// done and 60 more children of `b`. Returns the ids of a, b, m, s.
pub(crate) async fn flow_with_a_parent_done(c: &tokio_postgres::Client) -> [i64; 4] {
    let ids: String = c
        .query_one(
            r#"SELECT pgwake.flow('[{"name": "a", "task": "fetch_a"},
                                   {"name": "b", "task": "fetch_b"},
                                   {"name": "m", "task": "merge", "after": ["a", "b"]},
                                   {"name": "s", "task": "send", "after": ["m"],
                                    "on_parent_failure": "run"}]')::text"#,
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let ids: serde_json::Value = serde_json::from_str(&ids).unwrap();
    let id = |n: &str| ids[n].as_i64().unwrap();
    // `a` ends done: it leaves the queue, and its edge ends at the commit
    // (the deferred trigger, functions/flows.sql).
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&id("a")])
        .await
        .unwrap();
    c.execute(
        "SELECT pgwake.enqueue('fan', after => ARRAY[$1::int8]) FROM generate_series(1, 60)",
        &[&id("b")],
    )
    .await
    .unwrap();
    [id("a"), id("b"), id("m"), id("s")]
}

/// A job's page lists its parents and its children (issue 36, item 5),
/// each linked, with its task, where it is (done, waiting, held for its
/// own parents) and the edge's policy; a side with more than 50 shows the
/// first 50 and counts the rest; a job without edges shows neither list.
#[tokio::test]
async fn a_job_page_lists_its_parents_and_children_with_their_states_bounded() {
    let db = migrated_db().await;
    let c = db.client().await;
    let [a, b, m, s] = flow_with_a_parent_done(&c).await;
    let console = Console::start(&db, false).await;
    let page = get(&console, &format!("/jobs/{m}")).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let parents = table_at(&page.body, "id=\"parents\"");
    let row = |t: &str, id: i64| {
        let at = t
            .find(&format!("data-job=\"{id}\""))
            .unwrap_or_else(|| panic!("no row of job {id}: {t}"));
        let end = t[at..].find("</tr>").unwrap() + at;
        t[at..end].to_string()
    };
    let ra = row(&parents, a);
    assert!(ra.contains(&format!("href=\"/jobs/{a}\"")), "{ra}");
    // Ended done and gone, history off: its task is no longer known.
    assert!(ra.contains(">unknown<") && ra.contains(">done<"), "{ra}");
    let rb = row(&parents, b);
    assert!(rb.contains("fetch_b") && rb.contains(">waiting<"), "{rb}");
    assert!(
        rb.contains("<td>cancel</td>") && rb.contains("<td>open</td>"),
        "{rb}"
    );
    let children = table_at(&page.body, "id=\"children\"");
    let rs = row(&children, s);
    assert!(
        rs.contains("send") && rs.contains("held for its own parents"),
        "{rs}"
    );
    assert!(rs.contains("<td>run</td>"), "{rs}");
    // `b` has 61 children: the first 50 by id, and the rest counted.
    let page = get(&console, &format!("/jobs/{b}")).await.body;
    let children = table_at(&page, "id=\"children\"");
    assert_eq!(children.matches("data-job=").count(), 50, "{children}");
    assert!(
        children.contains(&format!("data-job=\"{m}\"")),
        "{children}"
    );
    assert!(page.contains("… and 11 more"), "{page}");
    assert!(!page.contains("id=\"parents\""), "{page}");
    // `s` waits for `m` only and has no children.
    let page = get(&console, &format!("/jobs/{s}")).await.body;
    assert_eq!(
        table_at(&page, "id=\"parents\"")
            .matches("data-job=")
            .count(),
        1
    );
    assert!(!page.contains("id=\"children\""), "{page}");
}
