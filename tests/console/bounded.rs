//! What one page renders is bounded: a job's recorded errors are shown a
//! few on its page and the rest a page at a time, each error and the
//! payload cut at a bound.

use crate::common::*;
use crate::support::*;

/// A job with 5,000 recorded errors of 2,000 characters and a 300 KB
/// payload: its page stays small and says how many errors there are, the
/// errors pages list them all 100 at a time, and a 100 KB error is cut.
#[tokio::test]
async fn a_job_with_thousands_of_errors_has_a_small_page_and_pages_of_errors() {
    let db = migrated_db().await;
    let c = db.client().await;
    let id: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('t', jsonb_build_object('blob', repeat('p', 300000)), queue => 'q')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "INSERT INTO pgwake.job_errors (job_id, attempt, error)
         SELECT $1, a, 'attempt ' || a || ' failed: ' || repeat('e', 2000) FROM generate_series(1, 5000) a",
        &[&id],
    )
    .await
    .unwrap();
    c.execute(
        "UPDATE pgwake.job_errors SET error = 'huge: ' || repeat('h', 100000) WHERE job_id = $1 AND attempt = 5000",
        &[&id],
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let page = get(&console, &format!("/jobs/{id}")).await;
    assert_eq!(
        page.status,
        200,
        "{}",
        &page.body[..page.body.len().min(2000)]
    );
    assert!(
        page.body.len() < 200_000,
        "the job page is {} bytes",
        page.body.len()
    );
    assert!(page.body.contains("5,000 recorded errors"), "{}", page.body);
    assert!(
        page.body.contains("attempt 4999 failed"),
        "the latest errors are shown"
    );
    assert!(!page.body.contains("attempt 1 failed"), "not every error");
    assert!(
        page.body.contains(&format!("/jobs/{id}/errors")),
        "a link to the rest"
    );
    assert!(
        page.body.contains("characters more"),
        "cut payload or error"
    );

    // All of them, 100 a page, in order.
    let mut seen = Vec::new();
    let mut n = 1;
    loop {
        let r = get(&console, &format!("/jobs/{id}/errors?page={n}")).await;
        assert_eq!(r.status, 200, "page {n}: {}", r.body);
        assert!(
            r.body.len() < 400_000,
            "errors page {n}: {} bytes",
            r.body.len()
        );
        let on_page: Vec<i64> = r
            .body
            .split("data-attempt=\"")
            .skip(1)
            .map(|s| s.split('"').next().unwrap().parse().unwrap())
            .collect();
        assert!(on_page.len() <= 100, "page {n}: {}", on_page.len());
        seen.extend(on_page);
        if !r.body.contains("id=\"next\"") {
            break;
        }
        n += 1;
        assert!(n <= 51, "more pages than errors");
    }
    assert_eq!(seen, (1..=5000).collect::<Vec<i64>>());
    for bad in ["0", "-1", "x", "99999999999999999999"] {
        let r = get(&console, &format!("/jobs/{id}/errors?page={bad}")).await;
        assert_eq!(r.status, 400, "page={bad}: {}", r.body);
    }
    let r = get(&console, "/jobs/999999/errors").await;
    assert_eq!(r.status, 404, "{}", r.body);
}

/// The overview is sampled once per refresh interval and shared: twelve
/// requests at once (twelve open tabs) get one sample, not twelve (issue
/// 33, item 7: twelve concurrent requests over 2,020 (queue, priority)
/// pairs took 8 s). It lists at most 200 queues and says how many more.
/// Fails without the shared sample (twelve sample times).
#[tokio::test]
async fn open_tabs_share_one_overview_sample_and_it_lists_a_bounded_number_of_queues() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (task, queue, priority)
         SELECT 't', 'q' || lpad(i::text, 4, '0'), p
         FROM generate_series(1, 205) i, generate_series(1, 3) p",
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let pages =
        futures::future::join_all((0..12).map(|_| get(&console, "/fragment/overview"))).await;
    let sampled: std::collections::BTreeSet<String> = pages
        .iter()
        .map(|p| {
            assert_eq!(p.status, 200, "{}", &p.body[..p.body.len().min(500)]);
            let at = p.body.find("data-sampled=\"").expect("the sample time") + 14;
            p.body[at..at + p.body[at..].find('"').unwrap()].to_string()
        })
        .collect();
    assert_eq!(
        sampled.len(),
        1,
        "one sample for twelve requests: {sampled:?}"
    );
    let body = &pages[0].body;
    assert_eq!(
        body.matches("href=\"/jobs?queue=").count(),
        200,
        "200 queues listed"
    );
    assert!(body.contains("And 5 more queues"), "{body}");
}

/// The Queues page lists 200 queues a page, with links to the others; a
/// page number that is not one is a 400 page.
#[tokio::test]
async fn the_queues_page_lists_a_page_at_a_time() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.pause_queue('q' || lpad(i::text, 4, '0')) FROM generate_series(1, 450) i",
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let rows = |body: &str| body.matches("data-queue=").count();
    let first = get(&console, "/queues").await;
    assert_eq!(first.status, 200);
    assert_eq!(rows(&first.body), 200, "one page of queues");
    assert!(first.body.contains("page 1 of 3"), "{}", first.body);
    assert!(first.body.contains("/queues?page=2"));
    let last = get(&console, "/queues?page=3").await;
    assert_eq!(rows(&last.body), 50);
    assert!(last.body.contains("q0450") && !last.body.contains("q0001\""));
    let bad = get(&console, "/queues?page=zero").await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}
