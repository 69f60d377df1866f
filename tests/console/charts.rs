//! The last hour's charts in a real browser (headless Chromium): a real
//! worker's outcomes reach the per-minute rollup, and the overview and a
//! queue's page draw them as inline SVG (throughput by outcome, pickup
//! latency, depth) with the right series, titled, with a queue name from a
//! producer shown as text and never run.

use std::time::Duration;

use fantoccini::Locator;
use pgwake::config::RollupConfig;
use pgwake::handlers::exec::ExecHandler;
use pgwake::{Worker, WorkerConfig};

use crate::common::*;
use crate::http::HOSTILE;
use crate::support::*;

/// Run `js` (a function body) in the page; its value.
async fn js(b: &Browser, script: &str) -> serde_json::Value {
    b.client.execute(script, vec![]).await.unwrap()
}

/// Per class of the throughput chart's bars, the sum of the counts their
/// titles give ("HH:MM done 5").
async fn bar_totals(b: &Browser) -> serde_json::Value {
    js(
        b,
        "const t = {};
         for (const c of ['s-done', 's-retried', 's-dead']) {
           t[c] = 0;
           for (const r of document.querySelectorAll('#chart-throughput rect.' + c)) {
             t[c] += parseInt(r.querySelector('title').textContent.split(' ').pop(), 10);
           }
         }
         return t;",
    )
    .await
}

async fn title(b: &Browser, chart: &str) -> String {
    js(
        b,
        &format!("return document.querySelector('#{chart} > title').textContent;"),
    )
    .await
    .as_str()
    .unwrap()
    .to_string()
}

#[tokio::test]
async fn the_overview_and_a_queues_page_chart_the_last_hour_from_the_rollup_in_a_browser() {
    let db = migrated_db().await;
    let c = db.client().await;
    let hostile = HOSTILE[1];
    // Queue `hostile`: 5 done, 2 failing twice (retried, then dead);
    // queue `other`: 3 done.
    c.batch_execute(
        "SELECT pgwake.enqueue('other_ok', '{}', queue => 'other') FROM generate_series(1, 3)",
    )
    .await
    .unwrap();
    for (task, n) in [("ok", 5), ("bad", 2)] {
        for _ in 0..n {
            c.execute(
                "SELECT pgwake.enqueue($1, '{}', queue => $2, max_attempts => 2)",
                &[&task, &hostile],
            )
            .await
            .unwrap();
        }
    }
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            rollup: Some(RollupConfig {
                flush_interval: Duration::from_millis(100),
                ..RollupConfig::default()
            }),
            sample_interval: Some(Duration::from_millis(200)),
            ..test_config()
        })
        .handler("ok", ExecHandler::parse("true").unwrap())
        .handler("other_ok", ExecHandler::parse("true").unwrap())
        .handler("bad", ExecHandler::parse("false").unwrap())
        .build()
        .unwrap();
    let w = Running::start(worker);
    until("12 runs counted and the depth sampled", 60, || async {
        let runs: i64 = db
            .scalar("SELECT coalesce(sum(jobs), 0)::int8 FROM pgwake.minute_stats")
            .await;
        let sampled: i64 = db.scalar("SELECT count(*) FROM pgwake.minute_depth").await;
        runs == 12 && sampled > 0
    })
    .await;
    let console = Console::start(&db, false).await;
    let b = Browser::start().await;

    b.client.goto(&console.url("/")).await.unwrap();
    b.client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#chart-throughput"))
        .await
        .unwrap();
    assert_eq!(
        title(&b, "chart-throughput").await,
        "Throughput of every queue, last hour, per minute: 8 done, 2 retried, 2 dead"
    );
    assert_eq!(
        bar_totals(&b).await,
        serde_json::json!({"s-done": 8, "s-retried": 2, "s-dead": 2})
    );
    assert!(title(&b, "chart-pickup").await.contains("mean"));
    let depth = title(&b, "chart-depth").await;
    assert!(
        depth.starts_with("Ready jobs of every queue, last hour: ")
            && depth.contains("at the last sample"),
        "{depth}"
    );
    let drawn = js(
        &b,
        "return ['chart-throughput', 'chart-pickup', 'chart-depth'].map(id =>
           document.getElementById(id).getBoundingClientRect().height);",
    )
    .await;
    for h in drawn.as_array().unwrap() {
        assert!(h.as_f64().unwrap() > 0.0, "every chart is drawn: {drawn}");
    }
    let points = js(
        &b,
        "return document.querySelectorAll('#chart-pickup circle.s-pickup-mean').length;",
    )
    .await;
    assert!(points.as_i64().unwrap() >= 1, "{points}");

    // The hostile queue's page: its own series, its name as text.
    b.client
        .goto(&console.url(&format!("/jobs?queue={}", encode(hostile))))
        .await
        .unwrap();
    b.client
        .wait()
        .at_most(Duration::from_secs(20))
        .for_element(Locator::Css("#chart-throughput"))
        .await
        .unwrap();
    assert_eq!(
        title(&b, "chart-throughput").await,
        format!("Throughput of queue {hostile}, last hour, per minute: 5 done, 2 retried, 2 dead")
    );
    assert_eq!(
        bar_totals(&b).await,
        serde_json::json!({"s-done": 5, "s-retried": 2, "s-dead": 2})
    );
    let table = js(
        &b,
        "return document.querySelector('details.chart-table').textContent;",
    )
    .await;
    assert!(table.as_str().unwrap().contains("Retried"), "{table}");
    assert!(!b.pwned().await, "a queue name ran as script");
    let images = b.client.find_all(Locator::Css("main img")).await.unwrap();
    assert!(images.is_empty(), "the queue name made an element");
    b.close().await;
    w.shutdown().await;
}
