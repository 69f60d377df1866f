//! Shedding under pressure (`pgwake queue set Q --shed-under-pressure on`):
//! when the governor's level (`pgwake.pressure()`, read by the worker's own
//! sampler) turns critical under a real pinned horizon, the shed queues
//! pause and a running worker stops taking their jobs while other queues
//! run on; `pgwake explain` says why, naming the horizon's holder; a shed
//! queue an operator resumes stays resumed; when the horizon is released
//! the governor resumes the queues it paused, and their jobs run. Ends with
//! a ledger check.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use pgwake::admin::queues;
use pgwake::Worker;

const LONG: Duration = Duration::from_secs(60);

async fn insert_into(c: &tokio_postgres::Client, queue: &str, n: i32) -> Vec<i64> {
    c.query(
        "INSERT INTO pgwake.jobs (queue, task) SELECT $1, 'work' FROM generate_series(1, $2)
         RETURNING id",
        &[&queue, &n],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

async fn level(c: &tokio_postgres::Client) -> String {
    c.query_one("SELECT level FROM pgwake.pressure_state", &[])
        .await
        .unwrap()
        .get(0)
}

async fn paused_by(c: &tokio_postgres::Client, queue: &str) -> (bool, Option<String>) {
    let r = c
        .query_one(
            "SELECT paused, paused_by FROM pgwake.queues WHERE name = $1",
            &[&queue],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

async fn until_ran(ledger: &Ledger, what: &str, ids: &[i64]) {
    let want: HashSet<i64> = ids.iter().copied().collect();
    wait_for(what, LONG, async || {
        let ran: HashSet<i64> = ledger.runs().iter().map(|r| r.0).collect();
        if want.is_subset(&ran) {
            Ok(())
        } else {
            Err(format!(
                "{} of {} ran",
                want.intersection(&ran).count(),
                want.len()
            ))
        }
    })
    .await;
}

#[tokio::test]
async fn shed_queues_pause_while_pressure_is_critical_and_resume_when_it_falls() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 2)",
    )
    .await
    .unwrap();
    queues::set_shed_under_pressure(&c, "reports", true)
        .await
        .unwrap();
    queues::set_shed_under_pressure(&c, "exports", true)
        .await
        .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            // The worker's own sampler runs the governor.
            sample_interval: Some(Duration::from_millis(100)),
            ..test_config()
        })
        .handler("work", ok_handler(&ledger))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    let before = insert_into(&c, "reports", 3).await;
    until_ran(
        &ledger,
        "a shed queue's jobs run while the pressure is ok",
        &before,
    )
    .await;

    // A forgotten BEGIN holds the horizon.
    let pin = connect_as(&db, "metabase").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    let pid: i32 = pin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    wait_for("the worker's sampler to shed", LONG, async || {
        let shed = (
            level(&c).await,
            paused_by(&c, "reports").await,
            paused_by(&c, "exports").await,
        );
        let by_pressure = (true, Some("pressure".to_string()));
        if shed.0 == "critical" && shed.1 == by_pressure && shed.2 == by_pressure {
            Ok(())
        } else {
            Err(format!("{shed:?}"))
        }
    })
    .await;

    // Shed jobs are inserted before the others, at the same priority: a
    // claim that took an `interactive` job would have taken them first had
    // it not skipped their queue (no timing involved).
    let shed = insert_into(&c, "reports", 3).await;
    let exported = insert_into(&c, "exports", 2).await;
    let interactive = insert_into(&c, "interactive", 3).await;
    until_ran(&ledger, "a queue not shed runs on", &interactive).await;
    let ran: HashSet<i64> = ledger.runs().iter().map(|r| r.0).collect();
    assert!(
        shed.iter().chain(&exported).all(|id| !ran.contains(id)),
        "a shed queue's job ran under critical pressure"
    );

    // explain names the pause's cause.
    let (reason, detail): (String, String) = c
        .query_one("SELECT reason, detail FROM pgwake.explain($1)", &[&shed[0]])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(reason, "paused");
    assert!(detail.starts_with("paused by pressure"), "{detail}");
    assert!(
        detail.contains(&format!("by pid {pid} (metabase)")),
        "{detail}"
    );

    // An operator resumes one shed queue: it runs, and the governor, still
    // critical, leaves it resumed.
    assert!(queues::resume(&c, "exports").await.unwrap());
    until_ran(&ledger, "an operator-resumed queue runs", &exported).await;
    let p = pgwake::admin::pressure::read(&c).await.unwrap();
    assert_eq!(p.level, pgwake::admin::pressure::Level::Critical);
    assert_eq!(paused_by(&c, "exports").await, (false, None));

    // The horizon is released: the governor resumes what it paused.
    pin.batch_execute("COMMIT").await.unwrap();
    until_ran(
        &ledger,
        "the shed queue's jobs after the pressure fell",
        &shed,
    )
    .await;
    assert_eq!(paused_by(&c, "reports").await, (false, None));
    let actions: Vec<(String, String, serde_json::Value)> = c
        .query(
            "SELECT previous, level, actions FROM pgwake.pressure_log ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let into_critical = actions.iter().find(|a| a.1 == "critical").unwrap();
    assert_eq!(
        into_critical.2["paused"],
        serde_json::json!(["exports", "reports"])
    );
    let out_of_critical = actions.iter().find(|a| a.0 == "critical").unwrap();
    assert_eq!(
        out_of_critical.2["resumed"],
        serde_json::json!(["reports"]),
        "only what is still paused by pressure is resumed"
    );
    w.stop.cancel();
    w.join.await.unwrap().unwrap();
    let all: Vec<i64> = [before, shed, exported, interactive].concat();
    assert_eq!(ledger.check(&all), vec![], "a job ran twice");
}

#[tokio::test]
async fn an_operator_pause_of_a_shed_queue_outlasts_the_pressure() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 2)",
    )
    .await
    .unwrap();
    let out = run_pgwake(
        &["queue", "set", "reports", "--shed-under-pressure", "maybe"],
        Some(&db.url),
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected on or off"),
        "{out:?}"
    );
    let out = run_pgwake(
        &["queue", "set", "reports", "--shed-under-pressure", "on"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{out:?}");
    let pin = connect_as(&db, "psql").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    wait_for("critical", LONG, async || {
        let p = pgwake::admin::pressure::read(&c).await.unwrap();
        if p.level == pgwake::admin::pressure::Level::Critical {
            Ok(())
        } else {
            Err(format!("{:?}", p.level))
        }
    })
    .await;
    assert_eq!(
        paused_by(&c, "reports").await,
        (true, Some("pressure".into()))
    );
    let out = run_pgwake(&["queue", "list"], Some(&db.url));
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = list.lines().find(|l| l.starts_with("reports")).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(cols[1], "shed", "{list}");
    assert!(list.lines().next().unwrap().contains("SHED"), "{list}");
    // The operator pauses it too: it is theirs now (already paused: false).
    assert!(!queues::pause(&c, "reports").await.unwrap());
    assert_eq!(paused_by(&c, "reports").await, (true, None));
    pin.batch_execute("COMMIT").await.unwrap();
    wait_for("the fall", LONG, async || {
        let p = pgwake::admin::pressure::read(&c).await.unwrap();
        if p.level == pgwake::admin::pressure::Level::Ok {
            Ok(())
        } else {
            Err(format!("{:?}", p.level))
        }
    })
    .await;
    assert_eq!(
        paused_by(&c, "reports").await,
        (true, None),
        "the operator's pause outlasts the pressure"
    );
    let list = queues::list(&c).await.unwrap();
    let reports = list.iter().find(|q| q.queue == "reports").unwrap();
    assert!(reports.shed_under_pressure && reports.paused);
}
