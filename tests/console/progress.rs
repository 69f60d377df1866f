//! A running job's progress on the console: shown on the jobs list and the
//! job page, every producer character escaped (plain HTTP and a real
//! browser). With the value written unescaped (`PreEscaped`) the `<img>`
//! and `<script>` of the hostile value land in the page and run.

use fantoccini::Locator;
use pgwake::client::{enqueue, NewJob};
use serde_json::json;

use crate::common::*;
use crate::support::*;

const FLUSH: &str = include_str!("../../src/db/sql/progress_flush.sql");

/// A job running in lease mode whose handler reported a hostile value and
/// message (written as the worker's flush writes them): its id.
async fn running_with_hostile_progress(db: &TestDb) -> i64 {
    let c = db.client().await;
    let id = enqueue(&c, &NewJob::new("import", json!({})))
        .await
        .unwrap();
    let rows = claim_lease_all(&c, "w1").await;
    let token: i64 = rows[0].get(12);
    let value =
        json!({"file": "</code><img src=x onerror=\"window.pwned=1\">", "n": 1}).to_string();
    let message = "<script>window.pwned=1</script>";
    let written = c
        .query(
            FLUSH,
            &[
                &vec![id],
                &vec![Some(token)],
                &vec![None::<String>],
                &vec![value],
                &vec![Some(message)],
            ],
        )
        .await
        .unwrap();
    assert_eq!(written.len(), 1);
    id
}

#[tokio::test]
async fn progress_is_shown_escaped_on_the_jobs_list_and_the_job_page() {
    let db = migrated_db().await;
    let id = running_with_hostile_progress(&db).await;
    let console = Console::start(&db, false).await;
    for path in [format!("/jobs/{id}"), "/jobs?state=running".to_string()] {
        let b = get(&console, &path).await.body;
        assert_eq!(
            b.matches("<script").count(),
            1,
            "{path}: only the console's own: {b}"
        );
        for raw in ["<img", "onerror=\"window"] {
            assert!(!b.contains(raw), "{path} holds {raw}: {b}");
        }
        assert!(
            b.contains("&lt;img src=x onerror="),
            "{path} shows the value: {b}"
        );
        assert!(
            b.contains("&lt;script&gt;window.pwned=1&lt;/script&gt;"),
            "{path}: {b}"
        );
    }
}

#[tokio::test]
async fn progress_never_runs_as_script_in_the_browser() {
    let db = migrated_db().await;
    let id = running_with_hostile_progress(&db).await;
    let console = Console::start(&db, false).await;
    let b = Browser::start().await;
    for path in [format!("/jobs/{id}"), "/jobs?state=running".to_string()] {
        b.client.goto(&console.url(&path)).await.unwrap();
        let body = crate::browser::text(&b, "main").await;
        assert!(
            body.contains("window.pwned=1"),
            "{path} shows the value: {body}"
        );
        assert!(!b.pwned().await, "{path} ran a producer's script");
        let images = b.client.find_all(Locator::Css("main img")).await.unwrap();
        assert!(images.is_empty(), "{path} holds an element from a producer");
    }
    let shown = crate::browser::text(&b, "#jobs").await;
    assert!(shown.contains("<script>window.pwned=1</script>"), "{shown}");
    b.client
        .goto(&console.url(&format!("/jobs/{id}")))
        .await
        .unwrap();
    let progress = crate::browser::text(&b, "#progress").await;
    assert!(
        progress.contains(r#"<img src=x onerror=\"window.pwned=1\">"#),
        "{progress}"
    );
    b.close().await;
}
