//! Access, escaping and the library functions behind the actions, over
//! plain HTTP.

use crate::common::*;
use crate::support::*;

use pgwake::admin::bulk::{self, BulkAction};
use pgwake::admin::jobs::JobFilter;
use pgwake::admin::schedules;

/// `n` dead jobs of `queue` (moved there as the worker buries them).
async fn dead_jobs(c: &tokio_postgres::Client, queue: &str, n: i64) -> Vec<i64> {
    let ids: Vec<i64> = c
        .query(
            "SELECT pgwake.enqueue('mail_send', jsonb_build_object('n', g), queue => $1)
             FROM generate_series(1, $2::int8) g",
            &[&queue, &n],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut dead: Vec<i64> = c
        .query(
            "WITH j AS (DELETE FROM pgwake.jobs WHERE id = ANY($1) RETURNING *)
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                                       max_attempts, last_error, created_at)
         SELECT id, queue, task, payload, priority, run_at, 1, 1, 'boom', created_at FROM j
         ORDER BY id
         RETURNING id",
            &[&ids],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    dead.sort_unstable();
    dead
}

#[tokio::test]
async fn a_read_only_console_shows_no_form_and_refuses_every_post() {
    let db = migrated_db().await;
    let c = db.client().await;
    let dead = dead_jobs(&c, "mail", 1).await;
    let console = Console::start(&db, false).await;
    for path in [
        "/",
        "/jobs",
        &format!("/jobs/{}", dead[0]),
        "/queues",
        "/schedules",
        "/workers",
    ] {
        let r = get(&console, path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert!(!r.body.contains("method=\"post\""), "{path} shows a form");
        assert!(r.body.contains("read-only"), "{path}");
        let csp = r.header("content-security-policy").unwrap();
        assert!(csp.contains("script-src 'self'"), "{csp}");
    }
    for (path, form) in [
        ("/actions/job", format!("id={}&op=retry&csrf=x", dead[0])),
        ("/actions/queue", "queue=mail&op=pause&csrf=x".to_string()),
        ("/bulk/apply", "action=retry&state=dead&csrf=x".to_string()),
        ("/login", format!("token={TOKEN}")),
    ] {
        let r = http(console.addr, "POST", path, &[], Some(&form)).await;
        assert_eq!(r.status, 403, "{path}: {}", r.body);
    }
    let still: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(still, 1);
    let paused: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queues WHERE paused")
        .await;
    assert_eq!(paused, 0);
}

#[tokio::test]
async fn actions_need_the_credential_the_csrf_token_and_the_consoles_own_origin() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.execute("SELECT pgwake.enqueue('t', queue => 'mail')", &[])
        .await
        .unwrap();
    let console = Console::start(&db, true).await;
    let pause = |csrf: &str| format!("queue=mail&op=pause&csrf={csrf}");

    // No session: 401; a wrong credential: 401 and no cookie.
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[],
        Some(&pause("x")),
    )
    .await;
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(login(&console, "not-the-token-at-all").await.is_none());
    let page = get(&console, "/queues").await;
    assert!(!page.body.contains("name=\"csrf\""), "forms before login");

    let (cookie, csrf) = login(&console, TOKEN).await.expect("login with the token");
    assert!(csrf.len() >= 32);
    let set = http(
        console.addr,
        "POST",
        "/login",
        &[],
        Some(&format!("token={TOKEN}")),
    )
    .await;
    let set_cookie = set.header("set-cookie").unwrap();
    assert!(
        set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Strict"),
        "{set_cookie}"
    );

    // A session without the CSRF token, or with another one: 403.
    for token in ["", "0123", &"a".repeat(64)] {
        let r = http(
            console.addr,
            "POST",
            "/actions/queue",
            &[("Cookie", &cookie)],
            Some(&pause(token)),
        )
        .await;
        assert_eq!(r.status, 403, "csrf {token:?}: {}", r.body);
    }
    // The right token from another site: 403.
    for (h, v) in [
        ("Origin", "http://evil.example"),
        ("Sec-Fetch-Site", "cross-site"),
    ] {
        let r = http(
            console.addr,
            "POST",
            "/actions/queue",
            &[("Cookie", &cookie), (h, v)],
            Some(&pause(&csrf)),
        )
        .await;
        assert_eq!(r.status, 403, "{h}: {}", r.body);
    }
    let paused: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queues WHERE paused")
        .await;
    assert_eq!(paused, 0, "a refused request changed something");

    // Everything right, from the console's own page: done.
    let origin = format!("http://{}", console.addr);
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie), ("Origin", &origin)],
        Some(&pause(&csrf)),
    )
    .await;
    assert_eq!(r.status, 303, "{}", r.body);
    let paused: bool = db
        .scalar("SELECT paused FROM pgwake.queues WHERE name = 'mail'")
        .await;
    assert!(paused);

    // Logged out, the cookie acts no more.
    let r = http(
        console.addr,
        "POST",
        "/logout",
        &[("Cookie", &cookie)],
        Some(&format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(r.status, 303);
    let r = http(
        console.addr,
        "POST",
        "/actions/queue",
        &[("Cookie", &cookie)],
        Some(&format!("queue=mail&op=resume&csrf={csrf}")),
    )
    .await;
    assert_eq!(r.status, 401);
}

#[test]
fn ui_actions_without_a_credential_is_refused_at_start_naming_it() {
    let out = pgwake_cmd()
        .args(["ui", "--ui-actions", "--ui-addr", "127.0.0.1:0"])
        .env_remove("PGWAKE_UI_TOKEN")
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PGWAKE_UI_TOKEN"), "{err}");
    // The suggested credential is saved where the operators can read it
    // back to log in, not generated straight into the environment.
    assert!(
        err.contains("openssl rand -hex 24 > ~/.pgwake-ui-token")
            && err.contains("PGWAKE_UI_TOKEN=$(cat ~/.pgwake-ui-token)"),
        "{err}"
    );
    let short = pgwake_cmd()
        .args(["ui", "--ui-actions", "--ui-addr", "127.0.0.1:0"])
        .env("PGWAKE_UI_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(short.status.code(), Some(2), "{short:?}");
    assert!(String::from_utf8_lossy(&short.stderr).contains("too short"));
}

/// Values a producer could choose to break out of the page.
pub const HOSTILE: &[&str] = &[
    "<script>window.pwned=1</script>",
    "\"'><img src=x onerror=\"window.pwned=1\">",
    "</code></pre><svg onload=window.pwned=1>",
    // Trojan Source: a right-to-left override and an isolate reorder what
    // the page shows.
    "pay\u{202e}fdp.exe\u{2066}x",
];

/// The bidirectional-text controls a page must never hold raw.
pub fn bidi(c: char) -> bool {
    matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Jobs with [`HOSTILE`] values in every field a producer sets (task,
/// queue, payload keys and values, ordering and unique keys), a dead one
/// with a hostile error, and a session with a hostile application name and
/// statement idle in a transaction. Returns the job ids and the session.
pub async fn hostile_jobs(db: &TestDb) -> (Vec<i64>, tokio_postgres::Client) {
    let c = db.client().await;
    let mut ids = Vec::new();
    for (i, h) in HOSTILE.iter().enumerate() {
        let payload = serde_json::json!({ *h: h, "n": i, "nested": { "v": h } });
        let id: i64 = c
            .query_one(
                "SELECT pgwake.enqueue($1, $2::text::jsonb, queue => $1,
                                       ordering_key => $1 || 'o', unique_key => $1 || 'u')",
                &[h, &payload.to_string()],
            )
            .await
            .unwrap()
            .get(0);
        ids.push(id);
    }
    // One dead with a hostile error, one scheduled with a hostile task.
    let dead: i64 = c
        .query_one(
            "WITH j AS (DELETE FROM pgwake.jobs WHERE id = $1 RETURNING *)
             INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                                           max_attempts, last_error, created_at, ordering_key, unique_key)
             SELECT id, queue, task, payload, priority, run_at, 1, 1, $2, created_at, ordering_key, unique_key
             FROM j RETURNING id",
            &[&ids[0], &HOSTILE[1]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead, ids[0]);
    let scheduled: i64 = c
        .query_one(
            "SELECT pgwake.enqueue($1, '{}', run_at => now() + interval '1 hour')",
            &[&HOSTILE[2]],
        )
        .await
        .unwrap()
        .get(0);
    ids.push(scheduled);
    // A child of two hostile jobs, its task and payload hostile: its page
    // lists its parents, and theirs list it.
    let child: i64 = c
        .query_one(
            "SELECT pgwake.enqueue($1, jsonb_build_object('k', $1::text),
                                   after => ARRAY[$2::int8, $3::int8])",
            &[&HOSTILE[0], &ids[1], &ids[3]],
        )
        .await
        .unwrap()
        .get(0);
    ids.push(child);
    // Queue settings and a schedule with hostile names.
    c.execute("SELECT pgwake.pause_queue($1)", &[&HOSTILE[1]])
        .await
        .unwrap();
    schedules::add(
        &c,
        &schedules::NewSchedule::new(HOSTILE[0], "0 3 * * *", HOSTILE[1]).queue(HOSTILE[2]),
    )
    .await
    .unwrap();
    // A session idle in a transaction, its name and statement hostile.
    let mut cfg = db.config();
    cfg.application_name(HOSTILE[1]);
    let idle = pgwake::connect::connect(&cfg).await.unwrap();
    idle.batch_execute(&format!(
        "BEGIN; SELECT txid_current(), '{}'::text",
        HOSTILE[0].replace('\'', "''")
    ))
    .await
    .unwrap();
    (ids, idle)
}

#[tokio::test]
async fn every_producer_value_is_escaped_and_no_password_or_url_shows() {
    let db = migrated_db().await;
    let (ids, _idle) = hostile_jobs(&db).await;
    // The console connects with a password in its URL (the socket's
    // authentication ignores it): it must show nowhere.
    let secret = "S3cret-Passw0rd-never-shown";
    let url = db
        .url
        .replacen("://postgres@", &format!("://postgres:{secret}@"), 1);
    assert!(url.contains(secret), "{url}");
    let with_password = TestDb {
        url: url.clone(),
        name: db.name.clone(),
    };
    let console = Console::start(&with_password, true).await;
    let (cookie, _) = login(&console, TOKEN).await.unwrap();
    let mut pages: Vec<String> = [
        "/",
        "/fragment/overview",
        "/jobs",
        "/jobs?state=dead",
        "/jobs?state=scheduled",
        "/queues",
        "/schedules",
        "/workers",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    pages.extend(ids.iter().map(|id| format!("/jobs/{id}")));
    pages.push(format!("/jobs?queue={}", encode(HOSTILE[1])));
    pages.push(format!(
        "/jobs?payload={}",
        encode(&format!("nested.v={}", HOSTILE[2]))
    ));
    let host_dir = url
        .split("host=")
        .nth(1)
        .unwrap_or("")
        .split('&')
        .next()
        .unwrap_or("");
    for path in &pages {
        let r = http(console.addr, "GET", path, &[("Cookie", &cookie)], None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let b = &r.body;
        assert_eq!(
            b.matches("<script").count(),
            usize::from(!path.starts_with("/fragment")),
            "{path}: {b}"
        );
        for raw in ["<img", "<svg", "onerror=\"window", "</pre><svg"] {
            assert!(!b.contains(raw), "{path} holds {raw}: {b}");
        }
        assert!(
            !b.chars().any(bidi),
            "{path} holds a bidi control raw: {b:?}"
        );
        for secret in [secret, url.as_str(), &db.url] {
            assert!(!b.contains(secret), "{path} shows {secret}");
        }
        if !host_dir.is_empty() {
            assert!(!b.contains(host_dir), "{path} shows the socket directory");
        }
    }
    // The values are there, as text.
    let job = get(&console, &format!("/jobs/{}", ids[1])).await.body;
    assert!(
        job.contains("&quot;&#39;&gt;&lt;img src=x") || job.contains("&quot;'&gt;&lt;img src=x"),
        "{job}"
    );
    let bidi_job = get(&console, &format!("/jobs/{}", ids[3])).await.body;
    assert!(
        bidi_job.contains(r"pay\u{202e}fdp.exe\u{2066}x"),
        "the bidi controls shown escaped: {bidi_job}"
    );
    // The child's page lists its hostile parents, their tasks as text.
    let child = get(&console, &format!("/jobs/{}", ids[5])).await.body;
    let parents = &child[child.find("id=\"parents\"").expect("the parents listed")..];
    assert!(
        parents.contains(r"pay\u{202e}fdp.exe\u{2066}x")
            && (parents.contains("&quot;&#39;&gt;&lt;img src=x")
                || parents.contains("&quot;'&gt;&lt;img src=x")),
        "{parents}"
    );
    let overview = get(&console, "/").await.body;
    assert!(
        overview.contains("&lt;script&gt;window.pwned=1&lt;/script&gt;"),
        "the idle session's statement: {overview}"
    );
}

/// "Retry everything dead in queue `mail` since 14:00": a time bound on the
/// filter (when the job died; for waiting jobs when it was enqueued), in
/// the library, on the Jobs page and its bulk form, and in `pgwake jobs
/// list --since`.
#[tokio::test]
async fn a_filter_since_a_time_selects_only_the_jobs_that_died_or_came_after_it() {
    let db = migrated_db().await;
    let c = db.client().await;
    let early = dead_jobs(&c, "mail", 2).await;
    c.execute(
        "UPDATE pgwake.dead_jobs SET failed_at = '2026-01-01 13:00+00' WHERE id = ANY($1)",
        &[&early],
    )
    .await
    .unwrap();
    let late = dead_jobs(&c, "mail", 2).await;
    c.execute(
        "UPDATE pgwake.dead_jobs SET failed_at = '2026-01-01 15:00+00' WHERE id = ANY($1)",
        &[&late],
    )
    .await
    .unwrap();
    let since: chrono::DateTime<chrono::Utc> = "2026-01-01T14:00:00Z".parse().unwrap();
    let filter = JobFilter {
        queue: Some("mail".into()),
        since: Some(since),
        page: 100,
        ..JobFilter::default()
    };
    let m = bulk::select(&c, &filter, BulkAction::Retry).await.unwrap();
    assert_eq!(m.ids, late, "only the jobs that died after 14:00");

    // The Jobs page, with the bound in the form's words (UTC).
    let console = Console::start(&db, false).await;
    let page = get(&console, "/jobs?queue=mail&since=2026-01-01+14%3A00").await;
    assert_eq!(page.status, 200, "{}", page.body);
    for id in &late {
        assert!(
            page.body.contains(&format!("/jobs/{id}\"")),
            "{}",
            page.body
        );
    }
    for id in &early {
        assert!(
            !page.body.contains(&format!("/jobs/{id}\"")),
            "{}",
            page.body
        );
    }
    let bad = get(&console, "/jobs?since=yesterday").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(bad.body.contains("2026-11-25 14:00"), "{}", bad.body);

    // The command line.
    let out = run_pgwake(
        &[
            "jobs",
            "list",
            "--queue",
            "mail",
            "--since",
            "2026-01-01T14:00:00Z",
            "--json",
        ],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<i64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, late);
}

#[tokio::test]
async fn bulk_actions_select_by_filter_and_change_only_what_matches() {
    let db = migrated_db().await;
    let c = db.client().await;
    let mail = dead_jobs(&c, "mail", 3).await;
    let other = dead_jobs(&c, "other", 2).await;
    let waiting: i64 = c
        .query_one("SELECT pgwake.enqueue('t', queue => 'mail')", &[])
        .await
        .unwrap()
        .get(0);
    let filter = JobFilter {
        queue: Some("mail".into()),
        page: 100,
        ..JobFilter::default()
    };
    let m = bulk::select(&c, &filter, BulkAction::Retry).await.unwrap();
    assert_eq!(m.ids, mail);
    assert!(!m.more);
    // Retrying waiting jobs, or cancelling dead ones, is refused.
    let dead_only = JobFilter {
        state: Some("dead".into()),
        ..filter.clone()
    };
    assert!(bulk::select(&c, &dead_only, BulkAction::Cancel)
        .await
        .is_err());
    let c_sel = bulk::select(&c, &filter, BulkAction::Cancel).await.unwrap();
    assert_eq!(c_sel.ids, vec![waiting]);

    assert_eq!(bulk::apply(&c, BulkAction::Retry, &m.ids).await.unwrap(), 3);
    let back: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue = 'mail'")
        .await;
    assert_eq!(back, 4);
    let left: Vec<i64> = c
        .query("SELECT id FROM pgwake.dead_jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, other, "the other queue's dead jobs are untouched");

    let all_mail = bulk::select(&c, &filter, BulkAction::Cancel).await.unwrap();
    assert_eq!(all_mail.ids.len(), 4);
    assert_eq!(
        bulk::apply(&c, BulkAction::Cancel, &all_mail.ids)
            .await
            .unwrap(),
        4
    );
    let cancelled: i64 = db
        .scalar("SELECT count(*) FROM pgwake.dead_jobs WHERE queue = 'mail' AND last_error = 'cancelled'")
        .await;
    assert_eq!(cancelled, 4);
    let del = bulk::select(&c, &filter, BulkAction::Delete).await.unwrap();
    assert_eq!(
        bulk::apply(&c, BulkAction::Delete, &del.ids).await.unwrap(),
        4
    );
    let gone: i64 = db
        .scalar("SELECT count(*) FROM pgwake.dead_jobs WHERE queue = 'mail'")
        .await;
    assert_eq!(gone, 0);
}

#[tokio::test]
async fn run_now_enqueues_one_job_as_the_next_tick_would_and_leaves_the_ticks() {
    let db = migrated_db().await;
    let c = db.client().await;
    schedules::add(
        &c,
        &schedules::NewSchedule::new("nightly", "0 3 * * *", "report")
            .queue("reports")
            .priority(-1)
            .payload(serde_json::json!({"n": 12345678901234567890u64})),
    )
    .await
    .unwrap();
    let before = schedules::list(&c).await.unwrap();
    let id = schedules::run_now(&c, "nightly").await.unwrap();
    let row = c
        .query_one(
            "SELECT task, queue, priority, payload::text, run_at <= now() FROM pgwake.jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "report");
    assert_eq!(row.get::<_, String>(1), "reports");
    assert_eq!(row.get::<_, i32>(2), -1);
    assert_eq!(row.get::<_, String>(3), r#"{"n": 12345678901234567890}"#);
    assert!(row.get::<_, bool>(4));
    assert_eq!(
        schedules::list(&c).await.unwrap(),
        before,
        "ticks and counters unchanged"
    );
    assert!(matches!(
        schedules::run_now(&c, "missing").await,
        Err(schedules::ScheduleError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_worker_started_with_ui_addr_serves_the_console_and_stops_with_it() {
    let db = migrated_db().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = Some(spawn_pgwake_run(
        &db.url,
        &["--handler", "t=exec:true", "--ui-addr", &addr.to_string()],
    ));
    // Killed if an assertion fails first.
    struct Reap<'a>(&'a mut Option<std::process::Child>);
    impl Drop for Reap<'_> {
        fn drop(&mut self) {
            if let Some(c) = self.0.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
    let reap = Reap(&mut child);
    until("the console answers", 60, || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    let mut live = String::new();
    for _ in 0..100 {
        live = http(addr, "GET", "/workers", &[], None).await.body;
        if live.contains("<code>t</code>") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(live.contains("read-only"), "{live}");
    assert!(
        live.contains("<code>t</code>"),
        "the worker lists itself: {live}"
    );
    let child = reap.0.take().unwrap();
    drop(reap);
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, std::time::Duration::from_secs(30)).await;
    assert!(out.status.success(), "{out:?}");
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn finished_jobs_are_listed_as_pgwake_list_jobs_lists_them_a_page_at_a_time() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.history_partition(current_date);
         INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, error, attempts,
                                           enqueued_at, finished_at, worker, unique_key)
         SELECT 1000 + i, 'q' || (i % 3), 't' || (i % 2), jsonb_build_object('customer', i % 5),
                CASE WHEN i % 4 = 0 THEN 'dead' ELSE 'done' END, CASE WHEN i % 4 = 0 THEN 'boom' END,
                1, now() - interval '1 minute', now() - make_interval(secs => i), 'w', 'u' || i
         FROM generate_series(1, 60) i;",
    )
    .await
    .unwrap();
    let filters = [
        JobFilter::default(),
        JobFilter {
            queue: Some("q1".into()),
            ..JobFilter::default()
        },
        JobFilter {
            task: Some("t0".into()),
            payload: Some(serde_json::json!({"customer": 3})),
            ..JobFilter::default()
        },
        JobFilter {
            unique_key: Some("u7".into()),
            ..JobFilter::default()
        },
    ];
    for f in filters {
        let mut after = 0;
        let mut pages = 0;
        loop {
            let page = JobFilter {
                state: Some("finished".into()),
                after_id: after,
                page: 7,
                ..f.clone()
            };
            let ours = pgwake::admin::jobs::list(&c, &page).await.unwrap();
            let payload = page.payload.as_ref().map(|p| p.to_string());
            let theirs: Vec<(i64, String, String, String, Option<String>)> = c
                .query(
                    "SELECT id, job_state, job_queue, job_task, last_error
                     FROM pgwake.list_jobs('finished', $1, $2, NULL, $3, $4::text::jsonb, $5, 7)",
                    &[&page.queue, &page.task, &page.unique_key, &payload, &after],
                )
                .await
                .unwrap()
                .iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
                .collect();
            let mine: Vec<_> = ours
                .iter()
                .map(|r| {
                    (
                        r.id,
                        r.state.clone(),
                        r.queue.clone(),
                        r.task.clone(),
                        r.last_error.clone(),
                    )
                })
                .collect();
            assert_eq!(mine, theirs, "{f:?} after {after}");
            pages += 1;
            match ours.last() {
                Some(last) if ours.len() == 7 => after = last.id,
                _ => break,
            }
        }
        assert!(pages >= 1);
    }
}

#[tokio::test]
async fn a_bulk_action_counts_first_and_changes_only_what_its_filters_match() {
    let db = migrated_db().await;
    let c = db.client().await;
    let mail = dead_jobs(&c, "mail", 3).await;
    let other = dead_jobs(&c, "other", 1).await;
    let console = Console::start(&db, true).await;
    let (cookie, csrf) = login(&console, TOKEN).await.unwrap();
    let post = |path: &'static str, form: String| {
        let cookie = cookie.clone();
        let addr = console.addr;
        async move { http(addr, "POST", path, &[("Cookie", &cookie)], Some(&form)).await }
    };
    // One job by id: counted 1, and only it changes.
    let one = format!(
        "csrf={csrf}&action=retry&state=dead&queue=mail&id={}",
        mail[1]
    );
    let review = post("/bulk/review", one.clone()).await;
    assert_eq!(review.status, 200, "{}", review.body);
    assert!(
        review.body.contains("<strong id=\"bulk-count\">1</strong>"),
        "{}",
        review.body
    );
    let still: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(still, 4, "the review changes nothing");
    let done = post("/bulk/apply", one).await;
    // Post, redirect, get: back to the Jobs page, which says what changed.
    assert_eq!(done.status, 303, "{}", done.body);
    let left: Vec<i64> = c
        .query("SELECT id FROM pgwake.dead_jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec![mail[0], mail[2], other[0]]);
    // The rest of queue mail, deleted for good; the other queue untouched.
    let rest = format!("csrf={csrf}&action=delete&state=dead&queue=mail");
    let review = post("/bulk/review", rest.clone()).await;
    assert!(
        review.body.contains("<strong id=\"bulk-count\">2</strong>"),
        "{}",
        review.body
    );
    post("/bulk/apply", rest).await;
    let left: Vec<i64> = c
        .query("SELECT id FROM pgwake.dead_jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, other);
    // Cancelling dead jobs is refused, naming what cancel applies to.
    let bad = post(
        "/bulk/review",
        format!("csrf={csrf}&action=cancel&state=dead"),
    )
    .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert!(
        bad.body.contains("waiting, scheduled, running"),
        "{}",
        bad.body
    );
}

#[tokio::test]
async fn the_overview_counts_retrying_jobs_and_limits_in_use_per_queue() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.enqueue('t', queue => 'mail');
         UPDATE pgwake.jobs SET attempts = 1, last_error = 'smtp', run_at = now() + interval '1 hour';
         SELECT pgwake.enqueue('t', queue => 'mail', run_at => now() + interval '1 hour');
         SELECT pgwake.set_queue_max_running('mail', 3);
         SELECT pgwake.set_queue_rate('mail', 5, interval '1 minute');",
    )
    .await
    .unwrap();
    let a = pgwake::admin::activity::queues(&c).await.unwrap();
    let mail = a.iter().find(|q| q.queue == "mail").expect("mail listed");
    assert_eq!(mail.retrying, 1, "{a:?}");
    assert_eq!((mail.leased, mail.tx_running), (0, 0));
    assert_eq!(mail.slots_used, Some(0));
    assert_eq!(mail.rate_used, 0);
    let console = Console::start(&db, false).await;
    let page = get(&console, "/").await.body;
    assert!(page.contains("Retrying"), "{page}");
    assert!(page.contains("0 / 3"), "max running in use / limit: {page}");
    assert!(page.contains("0 / 5/min"), "rate in use / limit: {page}");
}

/// The Schedules page disables and enables a schedule (with the session,
/// the CSRF token and the console's origin), and shows it disabled.
#[tokio::test]
async fn the_schedules_page_disables_and_enables_a_schedule() {
    let db = migrated_db().await;
    let c = db.client().await;
    schedules::add(
        &c,
        &schedules::NewSchedule::new("nightly", "0 3 * * *", "report"),
    )
    .await
    .unwrap();
    let console = Console::start(&db, true).await;
    let (cookie, csrf) = login(&console, TOKEN).await.expect("login");
    let origin = format!("http://{}", console.addr);
    let enabled = || async {
        db.scalar::<bool>("SELECT enabled FROM pgwake.schedules WHERE name = 'nightly'")
            .await
    };
    for (op, want) in [("disable", false), ("enable", true)] {
        let r = http(
            console.addr,
            "POST",
            "/actions/schedule",
            &[("Cookie", &cookie), ("Origin", &origin)],
            Some(&format!("name=nightly&op={op}&csrf={csrf}")),
        )
        .await;
        assert_eq!(r.status, 303, "{op}: {}", r.body);
        assert_eq!(enabled().await, want, "{op}");
        if !want {
            let page = http(
                console.addr,
                "GET",
                "/schedules",
                &[("Cookie", &cookie)],
                None,
            )
            .await;
            assert!(page.body.contains(">disabled<"), "{}", page.body);
            assert!(page.body.contains("value=\"enable\""), "{}", page.body);
        }
    }
    let r = http(
        console.addr,
        "POST",
        "/actions/schedule",
        &[("Cookie", &cookie), ("Origin", &origin)],
        Some(&format!("name=nightly&op=explode&csrf={csrf}")),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.body);
}

#[tokio::test]
async fn job_pages_say_not_finished_yet_while_history_is_on_and_the_job_waits() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id: i64 = c
        .query_one("SELECT pgwake.enqueue('t', '{}')", &[])
        .await
        .unwrap()
        .get(0);
    let console = Console::start(&db, false).await;
    let says = |body: &str| body.contains("Not finished yet") || body.contains("not finished yet");
    // History off: the pages say nothing of the kind.
    let page = get(&console, &format!("/jobs/{id}")).await;
    assert!(!says(&page.body), "{}", page.body);
    let out = run_pgwake(&["job", "show", &id.to_string()], Some(&db.url));
    assert!(!says(&String::from_utf8_lossy(&out.stdout)));
    // History on: the waiting job is not finished yet, on both pages.
    c.batch_execute("INSERT INTO pgwake.history_settings (keep) VALUES (interval '7 days') ON CONFLICT (singleton) DO UPDATE SET keep = excluded.keep")
        .await
        .unwrap();
    let page = get(&console, &format!("/jobs/{id}")).await;
    assert!(page.body.contains("id=\"not-finished\""), "{}", page.body);
    assert!(
        !page.body.contains("No finished run recorded"),
        "{}",
        page.body
    );
    let out = run_pgwake(&["job", "show", &id.to_string()], Some(&db.url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("history\n  not finished yet"), "{text}");
    let out = run_pgwake(&["job", "show", &id.to_string(), "--json"], Some(&db.url));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["history_on"], true);
    // Dead: finished, so no longer "not finished yet".
    c.execute(
        "WITH j AS (DELETE FROM pgwake.jobs WHERE id = $1 RETURNING *)
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
         SELECT id, queue, task, payload, priority, run_at, 1, 1, 'boom', created_at FROM j",
        &[&id],
    )
    .await
    .unwrap();
    let page = get(&console, &format!("/jobs/{id}")).await;
    assert!(!says(&page.body), "{}", page.body);
}

/// A snoozed job's page says why it waits ("snoozed", the how-manieth
/// time) and how often it snoozed.
#[tokio::test]
async fn a_snoozed_jobs_page_shows_its_snoozes() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('t', '{}'::jsonb, run_at => now() + interval '1 hour')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "INSERT INTO pgwake.job_snoozes (job_id, snoozes, snoozed_until)
         SELECT id, 14, run_at FROM pgwake.jobs WHERE id = $1",
        &[&id],
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let page = get(&console, &format!("/jobs/{id}")).await;
    assert_eq!(page.status, 200);
    assert!(
        page.body.contains("data-reason=\"snoozed\"")
            && page.body.contains("snoozed by its handler until"),
        "the reason's badge, in words"
    );
    assert!(page.body.contains("the 14th time"), "explain's count");
    assert!(
        page.body.contains("id=\"snoozes\">14 (no attempt used)"),
        "the count among the facts"
    );
}

/// A job's recorded steps on its page: each name, attempt and output, the
/// outputs' hostile strings escaped (no markup, no raw bidi control), a
/// 64 KiB output cut. With the output written unescaped (`PreEscaped`)
/// the script tag reaches the page.
#[tokio::test]
async fn a_jobs_steps_are_shown_escaped_and_cut() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id: i64 = c
        .query_one("SELECT pgwake.enqueue('t', '{}'::jsonb)", &[])
        .await
        .unwrap()
        .get(0);
    for (i, h) in HOSTILE.iter().enumerate() {
        c.execute(
            "INSERT INTO pgwake.job_steps (job_id, name, output, attempt)
             VALUES ($1, 'step-' || $2::int, jsonb_build_object('v', $3::text), 1)",
            &[&id, &(i as i32), h],
        )
        .await
        .unwrap();
    }
    c.execute(
        "INSERT INTO pgwake.job_steps (job_id, name, output, attempt)
         VALUES ($1, 'big', to_jsonb(repeat('y', 65000)), 2)",
        &[&id],
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let page = get(&console, &format!("/jobs/{id}")).await;
    assert_eq!(page.status, 200);
    assert!(page.body.contains("id=\"steps\""), "{}", page.body);
    assert!(page.body.contains("<code>step-0</code>"), "{}", page.body);
    assert!(!page.body.contains("<script>window.pwned"), "{}", page.body);
    assert!(!page.body.contains("<img src=x"), "{}", page.body);
    assert!(!page.body.contains("<svg onload"), "{}", page.body);
    assert!(
        page.body.contains("&lt;script&gt;window.pwned"),
        "escaped, shown"
    );
    assert!(
        !page.body.chars().any(bidi),
        "a bidi control raw on the page"
    );
    assert!(
        !page.body.contains(&"y".repeat(2_000)),
        "the big output cut"
    );
    assert!(
        page.body.contains(&format!("{}…", "y".repeat(100))),
        "cut, marked"
    );
}
