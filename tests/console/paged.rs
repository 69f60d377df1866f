//! The Workers and Schedules pages list 200 rows a page (issue 33, item 7:
//! with thousands of workers or schedules they rendered every one), with
//! previous and next links, read no more rows than the page needs, and
//! answer a page number that is not one with a 400 that says so.

use fantoccini::Locator;

use crate::common::*;
use crate::support::*;

/// `n` live workers `wk-0001` … and `gone` workers whose rows expired
/// (killed without deregistering), as `services::fleet` writes them.
async fn workers(c: &tokio_postgres::Client, n: i32, gone: i32) {
    c.execute(
        "INSERT INTO pgwake.workers (id, host, pid, version, application_name, tasks, concurrency, expires_at)
         SELECT 'wk-' || lpad(i::text, 4, '0'), 'wk-host-' || lpad(i::text, 4, '0'), i, 'test', 'pgwake',
                '{t}'::text[], 4, now() + interval '1 hour'
         FROM generate_series(1, $1) i
         UNION ALL
         SELECT 'gone-' || lpad(i::text, 4, '0'), 'gone-host-' || lpad(i::text, 4, '0'), i, 'test',
                'pgwake', '{t}', 4, now() - interval '1 minute'
         FROM generate_series(1, $2) i",
        &[&n, &gone],
    )
    .await
    .unwrap();
}

/// `n` schedules `sched-0001` … (straight into the table: schedule_add
/// validates each, which is not what this test is about).
async fn schedules(c: &tokio_postgres::Client, n: i32) {
    c.execute(
        "INSERT INTO pgwake.schedules (name, cron, task)
         SELECT 'sched-' || lpad(i::text, 4, '0'), '0 3 * * *', 't' FROM generate_series(1, $1) i",
        &[&n],
    )
    .await
    .unwrap();
}

/// The names of `prefix…` shown in the page's table cells, in order.
fn shown(body: &str, prefix: &str) -> Vec<String> {
    body.split(&format!("<td>{prefix}"))
        .skip(1)
        .map(|s| format!("{prefix}{}", s.split('<').next().unwrap()))
        .collect()
}

/// Hostile page numbers get a 400 page that says what a page number is,
/// and the console keeps serving.
async fn refuses_bad_page_numbers(console: &Console, path: &str) {
    for bad in [
        "0",
        "-1",
        "x",
        "1.5",
        "1e3",
        "99999999999999999999",
        "4294967295",
        "10001",
        "%00",
        "2;DROP",
    ] {
        let r = get(console, &format!("{path}?page={bad}")).await;
        assert_eq!(r.status, 400, "{path}?page={bad}: {}", r.body);
        assert!(
            r.body.contains("page number from 1 to 10000") || r.body.contains("control character"),
            "{path}?page={bad}: {}",
            r.body
        );
    }
    let r = get(console, &format!("{path}?page=1&page=2")).await;
    assert_eq!(r.status, 400, "a repeated page: {}", r.body);
    assert_eq!(get(console, path).await.status, 200, "still serving");
}

/// 450 live workers and 3 gone: 200 a page over three pages, each with the
/// links it needs; past the end an empty page that says so; hostile page
/// numbers a 400.
#[tokio::test]
async fn the_workers_page_lists_200_workers_a_page() {
    let db = migrated_db().await;
    workers(&db.client().await, 450, 3).await;
    let console = Console::start(&db, false).await;

    let mut seen = Vec::new();
    for (n, rows, prev, next) in [
        (1, 200, false, true),
        (2, 200, true, true),
        (3, 50, true, false),
    ] {
        let r = get(&console, &format!("/workers?page={n}")).await;
        assert_eq!(r.status, 200, "page {n}: {}", r.body);
        let live = shown(&r.body, "wk-host-");
        assert_eq!(live.len(), rows, "page {n} lists {rows} live workers");
        assert_eq!(r.body.contains("id=\"prev\""), prev, "page {n}: previous");
        assert_eq!(r.body.contains("id=\"next\""), next, "page {n}: next");
        if prev {
            assert!(r.body.contains(&format!("/workers?page={}", n - 1)));
        }
        if next {
            assert!(r.body.contains(&format!("/workers?page={}", n + 1)));
        }
        assert_eq!(shown(&r.body, "gone-host-").len(), 3, "the gone ones");
        seen.extend(live);
    }
    let all: Vec<String> = (1..=450).map(|i| format!("wk-host-{i:04}")).collect();
    assert_eq!(seen, all, "every live worker once, in order");
    assert_eq!(
        get(&console, "/workers")
            .await
            .body
            .matches("<td>wk-host-")
            .count(),
        200,
        "no page number: the first page"
    );
    let past = get(&console, "/workers?page=9").await;
    assert_eq!(past.status, 200);
    assert!(
        past.body.contains("No live worker on page 9"),
        "{}",
        past.body
    );
    assert!(past.body.contains("/workers?page=1"), "a way back");
    refuses_bad_page_numbers(&console, "/workers").await;
}

/// 450 schedules: 200 a page by name over three pages, each with the
/// links it needs; hostile page numbers a 400.
#[tokio::test]
async fn the_schedules_page_lists_200_schedules_a_page() {
    let db = migrated_db().await;
    schedules(&db.client().await, 450).await;
    let console = Console::start(&db, false).await;

    let mut seen = Vec::new();
    for (n, rows, prev, next) in [
        (1, 200, false, true),
        (2, 200, true, true),
        (3, 50, true, false),
    ] {
        let r = get(&console, &format!("/schedules?page={n}")).await;
        assert_eq!(r.status, 200, "page {n}: {}", r.body);
        let names = shown(&r.body, "sched-");
        assert_eq!(names.len(), rows, "page {n} lists {rows} schedules");
        assert_eq!(r.body.contains("id=\"prev\""), prev, "page {n}: previous");
        assert_eq!(r.body.contains("id=\"next\""), next, "page {n}: next");
        seen.extend(names);
    }
    let all: Vec<String> = (1..=450).map(|i| format!("sched-{i:04}")).collect();
    assert_eq!(seen, all, "every schedule once, by name");
    let past = get(&console, "/schedules?page=9").await;
    assert_eq!(past.status, 200);
    assert!(past.body.contains("No schedule on page 9"), "{}", past.body);
    refuses_bad_page_numbers(&console, "/schedules").await;
}

/// What a page's statement reads: the rows the plan's scan of `table`
/// returned, from `EXPLAIN ANALYZE`.
async fn rows_read(c: &tokio_postgres::Client, sql: &str, table: &str) -> i64 {
    let plan: serde_json::Value = c
        .query_one(&format!("EXPLAIN (ANALYZE, FORMAT JSON) {sql}"), &[])
        .await
        .unwrap()
        .get(0);
    fn walk(node: &serde_json::Value, table: &str, sum: &mut i64) {
        if node["Relation Name"] == table {
            *sum += node["Actual Rows"].as_i64().unwrap() * node["Actual Loops"].as_i64().unwrap();
        }
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, table, sum);
        }
    }
    let mut sum = 0;
    walk(&plan[0]["Plan"], table, &mut sum);
    sum
}

/// A page's statement reads the rows up to its page, not the whole
/// registry or every schedule: with 5,000 of each, page 2 reads at most
/// 401 rows (the first two pages and one more, which says whether there
/// is a next page).
#[tokio::test]
async fn a_page_reads_only_the_rows_up_to_it() {
    let db = migrated_db().await;
    let c = db.client().await;
    workers(&c, 5000, 0).await;
    schedules(&c, 5000).await;
    c.batch_execute("ANALYZE pgwake.workers; ANALYZE pgwake.schedules")
        .await
        .unwrap();
    let with = |file: &str| {
        std::fs::read_to_string(format!("{}/src/db/sql/{file}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|e| format!("-- {file}: {e}"))
            .replace("$1", "201")
            .replace("$2", "200")
    };
    let read = rows_read(&c, &with("workers_page.sql"), "workers").await;
    assert!(read <= 401, "the workers page read {read} rows of 5,000");
    let read = rows_read(&c, &with("schedule_page.sql"), "schedules").await;
    assert!(read <= 401, "the schedules page read {read} rows of 5,000");
}

/// In a real browser: the Workers and Schedules pages show 200 rows, and
/// *next page* and *previous page* lead to the next and back.
#[tokio::test]
async fn an_operator_pages_through_workers_and_schedules_in_a_browser() {
    let db = migrated_db().await;
    let c = db.client().await;
    workers(&c, 250, 0).await;
    schedules(&c, 250).await;
    let console = Console::start(&db, false).await;
    let b = Browser::start().await;
    for (path, rows) in [
        ("/workers", "tr[data-worker]"),
        ("/schedules", "tr[data-schedule]"),
    ] {
        b.client.goto(&console.url(path)).await.unwrap();
        let count = |css: &'static str| {
            let b = &b;
            async move { b.client.find_all(Locator::Css(css)).await.unwrap().len() }
        };
        assert_eq!(count(rows).await, 200, "{path}: the first page");
        b.client
            .find(Locator::Css("#next"))
            .await
            .unwrap_or_else(|e| panic!("{path}: no next link: {e}"))
            .click()
            .await
            .unwrap();
        until(&format!("{path}: page 2"), 20, || async {
            b.client
                .current_url()
                .await
                .unwrap()
                .as_str()
                .ends_with("?page=2")
        })
        .await;
        assert_eq!(count(rows).await, 50, "{path}: the second page");
        b.client
            .find(Locator::Css("#prev"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        until(&format!("{path}: back on page 1"), 20, || async {
            b.client
                .current_url()
                .await
                .unwrap()
                .as_str()
                .ends_with("?page=1")
        })
        .await;
        assert_eq!(count(rows).await, 200, "{path}: the first page again");
    }
    b.close().await;
}
