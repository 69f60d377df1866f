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

/// Three jobs of one limit key under a per-key limit of 2, on a worker
/// whose handler runs until stopped: two run, the third waits for a slot
/// of its key.
pub async fn key_at_its_limit(db: &TestDb) -> (Running, i64) {
    use pgwake::handlers::exec::ExecHandler;
    let c = db.client().await;
    queues::set_max_running_per_key(&c, QUEUE, Some(2))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id: i64 = c
            .query_one(
                "SELECT pgwake.enqueue('sleepy', queue => $1, limit_key => $2)",
                &[&QUEUE, &KEY],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    let worker = pgwake::Worker::builder(db.config())
        .config(test_config())
        .handler("sleepy", ExecHandler::parse("sleep 600").unwrap())
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_waiting(db).await;
    // Claims take the key's jobs in id order: the third waits.
    let held = ids[2];
    eventually(
        "two running, the third held at its key's limit",
        std::time::Duration::from_secs(60),
        || async {
            let leased: i64 = db
                .scalar("SELECT count(*) FROM pgwake.leased_jobs WHERE task = 'sleepy'")
                .await;
            let first: Option<String> = c
                .query("SELECT reason FROM pgwake.explain($1)", &[&held])
                .await
                .unwrap()
                .first()
                .map(|r| r.get(0));
            leased == 2 && first.as_deref() == Some("key_max_running")
        },
    )
    .await;
    (w, held)
}

#[tokio::test]
async fn a_job_held_at_its_keys_limit_says_so_in_words_with_the_reason_in_its_tooltip() {
    let db = migrated_db().await;
    let (w, held) = key_at_its_limit(&db).await;
    let console = Console::start(&db, false).await;
    let key_html = "&quot;&#39;&gt;&lt;img src=x onerror=&quot;window.pwned=1&quot;&gt;acmé";
    let key_alt = key_html.replace("&#39;", "'");
    for path in [
        "/jobs".to_string(),
        format!("/jobs?queue={}", encode(QUEUE)),
        format!("/jobs/{held}"),
    ] {
        let body = get(&console, &path).await.body;
        assert_escaped(&path, &body);
        // The words, with the running count of the key (read, not assumed).
        let words = format!("waiting for a slot of key <code>{key_html}</code>: 2 of 2 running");
        assert!(
            body.contains(&words) || body.contains(&words.replace("&#39;", "'")),
            "{path}: {body}"
        );
        // The machine name in the tooltip.
        assert!(
            body.contains("title=\"key_max_running: limit key"),
            "{path}: {body}"
        );
        if path.starts_with("/jobs?") || path == "/jobs" {
            // Each job's limit key in the table.
            let limit = format!("<code class=\"limit-key\">{key_html}</code>");
            assert!(
                body.contains(&limit) || body.contains(&limit.replace(key_html, &key_alt)),
                "{path}: {body}"
            );
            // The running ones say so in words too.
            assert!(!body.contains(">key_max_running<"), "{path}: {body}");
        } else {
            assert!(
                body.contains("Why isn&#39;t it running?")
                    || body.contains("Why isn't it running?"),
                "{body}"
            );
        }
    }
    w.stop.cancel();
    w.abort.cancel();
    let _ = w.join.await;
}

/// The text of the element with `id` in `body` (the first tag's content up
/// to its closing `<`, enough for the state badge).
fn text_of<'b>(body: &'b str, id: &str) -> &'b str {
    let at = body
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}: {body}"));
    let rest = &body[at..];
    let start = rest.find('>').unwrap() + 1;
    let end = rest[start..].find('<').unwrap() + start;
    &rest[start..end]
}

#[tokio::test]
async fn a_jobs_page_follows_its_newest_state_and_asks_why_only_while_it_waits() {
    use pgwake::admin::dead::{self, Selection};
    use pgwake::handlers::exec::ExecHandler;
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.history_settings (keep) VALUES (interval '7 days')
         ON CONFLICT (singleton) DO UPDATE SET keep = excluded.keep",
    )
    .await
    .unwrap();
    // Fails its one attempt the first time, succeeds the next.
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("ran");
    let script = format!(
        "sh -c 'if [ -e {0} ]; then exit 0; else touch {0}; exit 1; fi'",
        flag.display()
    );
    let id: i64 = c
        .query_one("SELECT pgwake.enqueue('flaky', max_attempts => 1)", &[])
        .await
        .unwrap()
        .get(0);
    let console = Console::start(&db, false).await;
    // Waiting: asked why.
    let page = get(&console, &format!("/jobs/{id}")).await.body;
    assert_eq!(text_of(&page, "state"), "waiting");
    let why = text_of(&page, "why");
    assert!(
        why == "Why isn't it running?" || why == "Why isn&#39;t it running?",
        "{why}"
    );
    let worker = pgwake::Worker::builder(db.config())
        .config(test_config())
        .handler("flaky", ExecHandler::parse(&script).unwrap())
        .build()
        .unwrap();
    let w = Running::start(worker);
    eventually("dead", std::time::Duration::from_secs(60), || async {
        db.scalar::<i64>("SELECT count(*) FROM pgwake.dead_jobs")
            .await
            == 1
    })
    .await;
    // Dead: not asked why it is not running.
    let page = get(&console, &format!("/jobs/{id}")).await.body;
    assert_eq!(text_of(&page, "state"), "dead");
    assert_eq!(text_of(&page, "why"), "Why it is dead");
    assert!(!page.contains("t it running?"), "{page}");
    // Retried, then done: the page says done, from its newest run.
    let sel = Selection {
        ids: Some(vec![id]),
        queue: None,
        all: false,
    };
    assert_eq!(dead::retry(&c, &sel).await.unwrap(), vec![id]);
    eventually("done", std::time::Duration::from_secs(60), || async {
        db.scalar::<i64>("SELECT count(*) FROM pgwake.finished_jobs WHERE outcome = 'done'")
            .await
            == 1
    })
    .await;
    let page = get(&console, &format!("/jobs/{id}")).await.body;
    assert_eq!(text_of(&page, "state"), "done", "{page}");
    assert_eq!(text_of(&page, "why"), "Finished");
    assert!(!page.contains("t it running?"), "{page}");
    assert!(page.contains("id=\"finished-words\""), "{page}");
    // The library says so too (pgwake job show).
    let d = pgwake::admin::jobs::show(&c, id).await.unwrap().unwrap();
    assert_eq!(d.job.unwrap().state, "done");
    w.stop.cancel();
    w.abort.cancel();
    let _ = w.join.await;
}
