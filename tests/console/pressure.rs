//! The governor on the overview: a banner while the recorded level is not
//! ok (level, since, causes, the queues it shed; every text from the
//! database escaped), gone once the level is ok, and the last hour of
//! changes as a time line.

use crate::common::*;
use crate::support::*;

use std::time::Duration;

use pgwake::admin::pressure::{self, Level};

const WAIT: Duration = Duration::from_secs(30);
/// An application_name a client chose: markup, to be shown as text.
const APP: &str = "<img src=x onerror=alert(1)>";

async fn drive_to(c: &tokio_postgres::Client, level: Level) {
    wait_for(&format!("level {level}"), WAIT, async || {
        let p = pressure::read(c).await.unwrap();
        if p.level == level {
            Ok(())
        } else {
            Err(format!("{:?}", p.level))
        }
    })
    .await;
}

#[tokio::test]
async fn the_overview_shows_a_pressure_banner_while_not_ok_and_the_last_hours_changes() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 2);
         SELECT pgwake.set_queue_shed_under_pressure('reports', true);",
    )
    .await
    .unwrap();
    let console = Console::start(&db, false).await;
    let calm = get(&console, "/").await.body;
    assert!(!calm.contains("pressure-banner"), "{calm}");
    assert!(
        calm.contains("the level has not changed in the last hour"),
        "{calm}"
    );

    let pin = connect_as(&db, APP).await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    let pid: i32 = pin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    drive_to(&c, Level::Critical).await;
    let page = wait_for("the banner", WAIT, async || {
        let b = get(&console, "/").await.body;
        if b.contains("pressure-banner") {
            Ok(b)
        } else {
            Err("no banner yet".into())
        }
    })
    .await;
    let banner = page
        .split("pressure-banner")
        .nth(1)
        .unwrap()
        .split("</div>")
        .next()
        .unwrap();
    assert!(banner.contains("critical"), "{banner}");
    assert!(banner.contains(&format!("by pid {pid} (")), "{banner}");
    assert!(
        banner.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "the application name, escaped: {banner}"
    );
    assert!(banner.contains("Shed: "), "{banner}");
    assert!(banner.contains(">reports</a>"), "{banner}");
    assert!(!page.contains("<img"), "unescaped markup: {page}");
    assert!(page.contains(">shed</span>"), "the queue's badge: {page}");

    pin.batch_execute("COMMIT").await.unwrap();
    drive_to(&c, Level::Ok).await;
    let page = wait_for("the banner to go", WAIT, async || {
        let b = get(&console, "/").await.body;
        if b.contains("pressure-banner") {
            Err("banner still shown".into())
        } else {
            Ok(b)
        }
    })
    .await;
    let timeline = page.split("pressure-log").nth(1).unwrap();
    // Newest first: critical → ok, elevated → critical, ok → elevated.
    let arrows: Vec<usize> = [
        "critical</span> → <span class=\"badge b-ok\">ok",
        "elevated</span> → <span class=\"badge b-bad\">critical",
        "ok</span> → <span class=\"badge b-warn\">elevated",
    ]
    .iter()
    .map(|s| {
        timeline
            .find(s)
            .unwrap_or_else(|| panic!("{s} missing: {timeline}"))
    })
    .collect();
    assert!(arrows.windows(2).all(|w| w[0] < w[1]), "{timeline}");
    assert!(timeline.contains("paused reports"), "{timeline}");
    assert!(timeline.contains("resumed reports"), "{timeline}");
    assert!(!timeline.contains("<img"), "{timeline}");
}
