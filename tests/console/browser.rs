//! An operator's work in a real browser (headless Chromium through
//! chromedriver) against a real worker and PostgreSQL: log in, read the
//! overview, filter jobs, open one and read why it waits, retry a dead job,
//! cancel running jobs in both delivery modes, pause a queue, retry in bulk
//! by filter — each effect checked in the database — and no producer value
//! runs as script.

use std::time::Duration;

use fantoccini::Locator;
use pgwake::handlers::exec::ExecHandler;
use pgwake::handlers::sql::SqlHandler;
use pgwake::{Worker, WorkerConfig};

use crate::common::*;
use crate::support::*;

/// A tx-mode SQL handler that sleeps on the server, and a table it writes.
async fn slow_sql_function(db: &TestDb) {
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION slow(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(3600); END $$;",
        )
        .await
        .unwrap();
}

/// The text of the first element matching `css`, once there (found again
/// if the page replaced it meanwhile).
pub(crate) async fn text(b: &Browser, css: &str) -> String {
    let mut last = String::new();
    for _ in 0..200 {
        match b.client.find(Locator::Css(css)).await {
            Ok(el) => match el.text().await {
                Ok(t) => return t,
                Err(e) => last = e.to_string(),
            },
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{css}: {last}");
}

/// Click the first element matching `css`, which submits a form or follows
/// a link, and wait until the page it was on is gone.
async fn click(b: &Browser, css: &str) {
    let el = b
        .client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"));
    el.click().await.unwrap();
    for _ in 0..200 {
        if el.tag_name().await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("clicking {css} left the page as it was");
}

async fn scalar<T>(c: &tokio_postgres::Client, sql: &str, id: i64) -> T
where
    T: for<'a> tokio_postgres::types::FromSql<'a>,
{
    c.query_one(sql, &[&id]).await.unwrap().get(0)
}

#[tokio::test]
async fn an_operator_sees_why_jobs_wait_and_retries_cancels_pauses_and_bulk_retries_in_a_browser() {
    let db = migrated_db().await;
    slow_sql_function(&db).await;
    let c = db.client().await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            job_timeout: Duration::from_secs(600),
            cancel_poll_interval: Duration::from_millis(200),
            ..test_config()
        })
        .handler("slow_tx", SqlHandler::parse("slow").unwrap())
        .handler("slow_lease", ExecHandler::parse("sleep 600").unwrap())
        .handler(
            "mail_send",
            ExecHandler::parse("sh -c 'echo smtp down >&2; exit 65'").unwrap(),
        )
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_waiting(&db).await;

    // Three mail jobs die; then mail is paused so that retried jobs stay
    // where the test can see them.
    let mut mail = Vec::new();
    for n in 0..3 {
        let id: i64 = c
            .query_one(
                "SELECT pgwake.enqueue('mail_send', jsonb_build_object('to', $1::int), queue => 'mail', max_attempts => 1)",
                &[&n],
            )
            .await
            .unwrap()
            .get(0);
        mail.push(id);
    }
    until("three dead mail jobs", 60, || async {
        db.scalar::<i64>("SELECT count(*) FROM pgwake.dead_jobs WHERE queue = 'mail'")
            .await
            == 3
    })
    .await;
    c.execute("SELECT pgwake.pause_queue('mail')", &[])
        .await
        .unwrap();
    // A job held by a paused queue, and one running in each delivery mode.
    c.execute("SELECT pgwake.pause_queue('held')", &[])
        .await
        .unwrap();
    let held: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('report', '{\"customer\": 42}', queue => 'held')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let tx_job: i64 = c
        .query_one("SELECT pgwake.enqueue('slow_tx', queue => 'work')", &[])
        .await
        .unwrap()
        .get(0);
    let lease_job: i64 = c
        .query_one("SELECT pgwake.enqueue('slow_lease', queue => 'work')", &[])
        .await
        .unwrap()
        .get(0);
    until("both slow jobs running", 60, || async {
        let leased: i64 = db
            .scalar("SELECT count(*) FROM pgwake.leased_jobs WHERE task = 'slow_lease'")
            .await;
        let tx: Vec<String> = c
            .query("SELECT reason FROM pgwake.explain($1)", &[&tx_job])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        leased == 1 && tx == ["running"]
    })
    .await;

    let console = Console::start(&db, true).await;
    let b = Browser::start().await;

    // Log in.
    b.client.goto(&console.url("/login?next=/")).await.unwrap();
    b.client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(&b, "button[type=submit]").await;
    let who = text(&b, "header .who").await;
    assert!(
        who.contains("actions on"),
        "{who}: {}",
        b.client.source().await.unwrap()
    );

    // The overview lists the queues, with the held one paused.
    let overview = text(&b, "main").await;
    for q in ["held", "mail", "work"] {
        assert!(overview.contains(q), "{overview}");
    }
    assert!(overview.contains("paused"), "{overview}");
    assert!(
        overview.to_lowercase().contains("database pressure"),
        "{overview}"
    );

    // Filter the jobs by queue and payload, and read the badge.
    b.client.goto(&console.url("/jobs")).await.unwrap();
    b.client
        .find(Locator::Css("input[name=queue]"))
        .await
        .unwrap()
        .send_keys("held")
        .await
        .unwrap();
    b.client
        .find(Locator::Css("input[name=payload]"))
        .await
        .unwrap()
        .send_keys("customer=42")
        .await
        .unwrap();
    click(&b, "form.filters button[type=submit]").await;
    let row = text(&b, &format!("tr[data-job='{held}']")).await;
    assert!(row.contains("waiting") && row.contains("paused"), "{row}");
    let rows = b
        .client
        .find_all(Locator::Css("#jobs tbody tr"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);

    // Open the job and read its explanation.
    click(&b, &format!("tr[data-job='{held}'] a")).await;
    let why = text(&b, "#explanation").await;
    assert!(
        why.contains("paused") && why.contains("queue 'held' is paused"),
        "{why}"
    );
    assert!(text(&b, "#payload").await.contains("\"customer\": 42"));

    // Retry a dead job from its page.
    b.client
        .goto(&console.url(&format!("/jobs/{}", mail[0])))
        .await
        .unwrap();
    assert_eq!(text(&b, "#state").await, "dead");
    click(&b, "button[value=retry]").await;
    assert!(text(&b, ".notice").await.contains("Retried"));
    let back: i64 = scalar(
        &c,
        "SELECT count(*) FROM pgwake.jobs WHERE id = $1",
        mail[0],
    )
    .await;
    assert_eq!(back, 1, "the retried job is back in pgwake.jobs");

    // Cancel the running tx-mode job and the running lease-mode job.
    for id in [tx_job, lease_job] {
        b.client
            .goto(&console.url(&format!("/jobs/{id}")))
            .await
            .unwrap();
        assert_eq!(text(&b, "#state").await, "running");
        click(&b, "button[value=cancel]").await;
        // A running job: a confirmation first, nothing changed yet.
        assert!(text(&b, "#confirm-cancel").await.contains("is running now"));
        let still: i64 = scalar(
            &c,
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = $1",
            id,
        )
        .await;
        assert_eq!(still, 0, "nothing changes before the confirmation");
        click(&b, "#confirm").await;
        let n = text(&b, ".notice").await;
        assert!(n.contains("Cancel"), "{n}");
        until("the job is cancelled", 60, || async {
            c.query(
                "SELECT 1 FROM pgwake.dead_jobs WHERE id = $1 AND last_error = 'cancelled'",
                &[&id],
            )
            .await
            .unwrap()
            .len()
                == 1
        })
        .await;
    }

    // Pause a queue from the Queues page.
    c.execute(
        "SELECT pgwake.enqueue('report', queue => 'reports', run_at => now() + interval '1 hour')",
        &[],
    )
    .await
    .unwrap();
    b.client.goto(&console.url("/queues")).await.unwrap();
    click(&b, "tr[data-queue='reports'] button[value=pause]").await;
    assert!(text(&b, ".notice").await.contains("paused"));
    let paused: bool = db
        .scalar("SELECT paused FROM pgwake.queues WHERE name = 'reports'")
        .await;
    assert!(paused);

    // Retry every dead job of queue mail: the count first, then the change.
    b.client
        .goto(&console.url("/jobs?state=dead&queue=mail"))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("select[name=action]"))
        .await
        .unwrap()
        .select_by_value("retry")
        .await
        .unwrap();
    click(&b, "form[action='/bulk/review'] button").await;
    assert_eq!(text(&b, "#bulk-count").await, "2");
    let still: i64 = db
        .scalar("SELECT count(*) FROM pgwake.dead_jobs WHERE queue = 'mail'")
        .await;
    assert_eq!(still, 2, "nothing changes before the confirmation");
    click(&b, "#confirm").await;
    assert!(text(&b, "#bulk-done").await.contains("2"));
    let dead: i64 = db
        .scalar("SELECT count(*) FROM pgwake.dead_jobs WHERE queue = 'mail'")
        .await;
    let waiting: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue = 'mail'")
        .await;
    assert_eq!((dead, waiting), (0, 3));

    assert!(!b.pwned().await);
    b.close().await;
    w.stop.cancel();
    w.abort.cancel();
    let _ = w.join.await;
}

#[tokio::test]
async fn no_producer_value_runs_as_script_in_the_browser() {
    let db = migrated_db().await;
    let (ids, _idle) = crate::http::hostile_jobs(&db).await;
    let console = Console::start(&db, true).await;
    let b = Browser::start().await;
    b.client.goto(&console.url("/login?next=/")).await.unwrap();
    b.client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(&b, "button[type=submit]").await;
    let mut pages: Vec<String> = [
        "/",
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
    for path in &pages {
        b.client.goto(&console.url(path)).await.unwrap();
        let body = text(&b, "main").await;
        assert!(!body.is_empty(), "{path}");
        assert!(!b.pwned().await, "{path} ran a producer's script");
        assert!(
            !body.chars().any(crate::http::bidi),
            "{path} shows a bidi control raw: {body:?}"
        );
        let images = b
            .client
            .find_all(Locator::Css("main img, main svg"))
            .await
            .unwrap();
        assert!(images.is_empty(), "{path} holds an element from a producer");
    }
    // The overview refreshes itself: its fragment is escaped too.
    b.client.goto(&console.url("/")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !b.pwned().await,
        "the refreshed overview ran a producer's script"
    );
    // The values are shown, as text.
    b.client
        .goto(&console.url(&format!("/jobs/{}", ids[1])))
        .await
        .unwrap();
    let payload = text(&b, "#payload").await;
    assert!(payload.contains("<img src=x onerror="), "{payload}");
    // A child of two of them lists its parents, their tasks as text, each
    // a link to its page; the parent's page lists the child.
    b.client
        .goto(&console.url(&format!("/jobs/{}", ids[5])))
        .await
        .unwrap();
    let parents = text(&b, "#parents").await;
    assert!(
        parents.contains("\"'><img src=x onerror=\"window.pwned=1\">")
            && parents.contains(r"pay\u{202e}fdp.exe\u{2066}x"),
        "{parents}"
    );
    click(&b, &format!("#parents a[href='/jobs/{}']", ids[1])).await;
    assert_eq!(text(&b, "h1").await, format!("Job {} waiting", ids[1]));
    let children = text(&b, "#children").await;
    assert!(
        children.contains("<script>window.pwned=1</script>")
            && children.contains("held for its own parents"),
        "{children}"
    );
    assert!(!b.pwned().await, "a job's parents or children ran a script");
    b.close().await;
}

/// The README's and the book's screenshots: run with `--ignored` to make
/// them again (docs/src/images/).
#[tokio::test]
#[ignore = "rewrites docs/src/images: run by hand with --ignored when the pages change"]
async fn screenshots_for_the_docs() {
    let db = migrated_db().await;
    let c = db.client().await;
    // Jobs held for every kind of reason, first by id: a paused queue and an
    // ordering key (crm), a full max-running limit (email), a task no
    // worker has a handler for (images), a scheduled job (reports); then
    // a backlog, and thumbnails that finish (history on: jobs/s).
    c.batch_execute(
        "SELECT pgwake.pause_queue('crm');
         SELECT pgwake.set_queue_max_running('email', 2);
         SELECT pgwake.set_queue_rate('thumbs', 40, interval '1 second');
         INSERT INTO pgwake.history_settings (keep) VALUES (interval '7 days')
             ON CONFLICT (singleton) DO UPDATE SET keep = excluded.keep;
         SELECT pgwake.enqueue('sync_crm', jsonb_build_object('customer', 42, 'amount', 1234567890.123456789),
                               queue => 'crm', ordering_key => 'customer:42') FROM generate_series(1, 3);
         SELECT pgwake.set_queue_max_running_per_key('email', 1);
         SELECT pgwake.set_queue_limit_key_path('email', 'customer');
         SELECT pgwake.set_queue_fair_keys('email', true);
         SELECT pgwake.enqueue('send_email', jsonb_build_object('to', 'user' || g || '@example.com',
                                                                'customer', CASE WHEN g <= 4 THEN 'acme' ELSE 'globex' END),
                               queue => 'email')
           FROM generate_series(1, 6) g;
         SELECT pgwake.enqueue('resize_image', jsonb_build_object('image', g || '.jpg', 'width', 1280), queue => 'images')
           FROM generate_series(1, 3) g;
         SELECT pgwake.enqueue('report', '{\"month\": \"2026-11\"}', queue => 'reports', run_at => now() + interval '10 minutes');
         SELECT pgwake.enqueue('resize_image', jsonb_build_object('image', g || '.jpg'), queue => 'images')
           FROM generate_series(4, 840) g;
         SELECT pgwake.enqueue('thumbnail', jsonb_build_object('image', g || '.jpg'), queue => 'thumbs')
           FROM generate_series(1, 2000) g;
         SELECT pgwake.enqueue('charge', jsonb_build_object('order', g), queue => 'payments', max_attempts => 2)
           FROM generate_series(1, 40) g;",
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(vec![
                "email".into(),
                "reports".into(),
                "thumbs".into(),
                "images".into(),
                "payments".into(),
            ]),
            // The last hour's charts: counts flushed and depth sampled
            // within the wait below.
            rollup: Some(pgwake::config::RollupConfig {
                flush_interval: Duration::from_millis(200),
                ..Default::default()
            }),
            sample_interval: Some(Duration::from_millis(500)),
            ..test_config()
        })
        .handler("send_email", ExecHandler::parse("sleep 600").unwrap())
        .handler("charge", ExecHandler::parse("false").unwrap())
        .handler("report", ExecHandler::parse("true").unwrap())
        .handler("thumbnail", ExecHandler::parse("true").unwrap())
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_waiting(&db).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let console = Console::start(&db, true).await;
    let b = Browser::start().await;
    b.client.set_window_size(1280, 860).await.unwrap();
    b.client.goto(&console.url("/login?next=/")).await.unwrap();
    b.client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(&b, "button[type=submit]").await;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/images");
    std::fs::create_dir_all(&dir).unwrap();
    let crm: i64 = db
        .scalar("SELECT max(id) FROM pgwake.jobs WHERE queue = 'crm'")
        .await;
    for (path, file) in [
        ("/".to_string(), "console-overview.png"),
        (format!("/jobs/{crm}"), "console-job.png"),
        ("/jobs?state=waiting".to_string(), "console-explain.png"),
        ("/jobs?queue=payments".to_string(), "console-queue.png"),
    ] {
        b.client.goto(&console.url(&path)).await.unwrap();
        text(&b, "main").await;
        let png = b.client.screenshot().await.unwrap();
        std::fs::write(dir.join(file), png).unwrap();
    }
    b.close().await;
    w.stop.cancel();
    w.abort.cancel();
    let _ = w.join.await;
}

/// Issue 38, item 1 in Chromium: a wrong credential is a page; the header
/// says actions are on; the Jobs page, 1,400 px wide, counts per state,
/// holds a 5,000-character error and hostile names without scrolling
/// sideways, says why a job waits in words with the reason's machine name
/// in its tooltip and shows its limit key; the page has the console's own
/// icon; no producer value runs.
#[tokio::test]
async fn the_jobs_page_reads_in_words_and_fits_1400_px_in_a_browser() {
    use crate::limits::{key_at_its_limit, KEY, QUEUE};
    let db = migrated_db().await;
    let (w, held) = key_at_its_limit(&db).await;
    let c = db.client().await;
    // A dead job whose error is one long line.
    let long = format!("{}{}", crate::http::HOSTILE[1], "x".repeat(5000));
    let boom: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('boom', queue => $1, limit_key => $2, run_at => now() + interval '1 hour')",
            &[&QUEUE, &KEY],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "WITH d AS (DELETE FROM pgwake.jobs WHERE id = $1 RETURNING *)
         INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts,
                                       max_attempts, last_error, created_at, limit_key)
         SELECT id, queue, task, payload, priority, run_at, 1, 1, $2, created_at, limit_key FROM d",
        &[&boom, &long],
    )
    .await
    .unwrap();
    let console = Console::start(&db, true).await;
    let b = Browser::start().await;
    b.client.set_window_size(1400, 900).await.unwrap();

    // A wrong credential: the login page again, rendered, saying so.
    b.client
        .goto(&console.url("/login?next=/jobs"))
        .await
        .unwrap();
    b.client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys("not-the-credential-at-all")
        .await
        .unwrap();
    click(&b, "button[type=submit]").await;
    assert!(text(&b, ".panel.error")
        .await
        .contains("That is not the credential"));
    assert_eq!(text(&b, "h1").await, "Log in");
    let kind = b
        .client
        .execute("return document.contentType;", vec![])
        .await
        .unwrap();
    assert_eq!(kind, "text/html");
    assert_eq!(text(&b, "#actions").await, "actions on");
    b.client
        .find(Locator::Css("#token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    click(&b, "button[type=submit]").await;
    assert_eq!(text(&b, "#actions").await, "actions on");

    // The Jobs page: counts, words, limit keys, no sideways overflow.
    let counts = text(&b, "#state-counts").await;
    assert!(
        counts.contains("running 2") && counts.contains("dead or cancelled 1"),
        "{counts}"
    );
    let badge = b
        .client
        .find(Locator::Css(&format!("tr[data-job='{held}'] .reason")))
        .await
        .unwrap();
    let words = badge.text().await.unwrap();
    assert_eq!(
        words,
        format!("waiting for a slot of key {KEY}: 2 of 2 running")
    );
    let title = badge.attr("title").await.unwrap().unwrap();
    assert!(title.starts_with("key_max_running: "), "{title}");
    let row = text(&b, &format!("tr[data-job='{held}']")).await;
    assert!(row.contains(&format!("limit {KEY}")), "{row}");
    let fits = b
        .client
        .execute(
            "const t = document.querySelector('#jobs'); const p = t.parentElement;
             return [document.documentElement.scrollWidth, document.documentElement.clientWidth,
                     p.scrollWidth, p.clientWidth];",
            vec![],
        )
        .await
        .unwrap();
    let n: Vec<i64> = serde_json::from_value(fits).unwrap();
    assert!(n[0] <= n[1], "the page scrolls sideways: {n:?}");
    assert!(
        n[2] <= n[3],
        "the jobs table scrolls sideways in its panel: {n:?}"
    );
    // The error is cut in the table, whole on the job page.
    b.client
        .goto(&console.url(&format!("/jobs/{boom}")))
        .await
        .unwrap();
    assert_eq!(text(&b, "#why").await.to_lowercase(), "why it is dead");
    assert!(text(&b, "#last-error").await.contains(&"x".repeat(3900)));

    // The Queues page sets the per-key limits (the form under its
    // disclosure): the path, a per-key rate and fair keys.
    b.client.goto(&console.url("/queues")).await.unwrap();
    b.client
        .find(Locator::Css("details.key-forms summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    for (field, value) in [("limit_key_path", "customer_id"), ("rate_per_key", "5/s")] {
        b.client
            .find(Locator::Css(&format!(
                "details.key-forms input[name={field}]"
            )))
            .await
            .unwrap()
            .send_keys(value)
            .await
            .unwrap();
    }
    b.client
        .find(Locator::Css("details.key-forms input[name=fair_keys]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    click(&b, "form input[value=keys] ~ button").await;
    assert!(text(&b, ".notice").await.contains("Limits saved"));
    let s = pgwake::admin::queues::list(&c)
        .await
        .unwrap()
        .into_iter()
        .find(|q| q.queue == QUEUE)
        .unwrap();
    assert_eq!(s.limit_key_path.as_deref(), Some("customer_id"));
    assert_eq!(
        s.rate_per_key.map(|r| r.to_string()).as_deref(),
        Some("5/s")
    );
    assert!(s.fair_keys);
    assert_eq!(s.max_running_per_key, Some(2), "left as it was");
    let keys = text(&b, "td.keys").await;
    assert!(
        keys.contains("customer_id") && keys.contains("5/s per key") && keys.contains("fair"),
        "{keys}"
    );

    // The console's own icon, loaded from itself.
    let icon = b
        .client
        .execute(
            "return fetch(document.querySelector('link[rel=icon]').href)
               .then(r => r.headers.get('content-type'));",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(icon, "image/svg+xml");
    assert!(!b.pwned().await);
    b.close().await;
    w.stop.cancel();
    w.abort.cancel();
    let _ = w.join.await;
}

/// A job enqueued with a trace context: its page shows the trace id, and
/// the link the operator configured (`--ui-trace-link`) opens that trace;
/// a job without one shows neither. (Without the page's trace panel, the
/// `#trace-id` element is never found.)
#[tokio::test]
async fn a_job_page_shows_the_trace_id_and_the_operators_trace_link() {
    let db = migrated_db().await;
    let c = db.client().await;
    let traced: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('t', traceparent => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let plain: i64 = c
        .query_one("SELECT pgwake.enqueue('t')", &[])
        .await
        .unwrap()
        .get(0);
    let config = pgwake::console::ConsoleConfig {
        trace_link: Some("https://jaeger.example.com/trace/{trace_id}?from=pgwake".into()),
        ..pgwake::console::ConsoleConfig::default()
    };
    let console = Console::start_with(&db, "127.0.0.1:0", config)
        .await
        .unwrap();
    let b = Browser::start().await;
    b.client
        .goto(&console.url(&format!("/jobs/{traced}")))
        .await
        .unwrap();
    assert_eq!(
        text(&b, "#trace-id").await,
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    let href = b
        .client
        .find(Locator::Css("#trace-link"))
        .await
        .unwrap()
        .attr("href")
        .await
        .unwrap();
    assert_eq!(
        href.as_deref(),
        Some("https://jaeger.example.com/trace/4bf92f3577b34da6a3ce929d0e0e4736?from=pgwake")
    );
    b.client
        .goto(&console.url(&format!("/jobs/{plain}")))
        .await
        .unwrap();
    text(&b, "#state").await;
    assert!(b.client.find(Locator::Css("#trace")).await.is_err());
    b.close().await;
}
