//! Observability, proven with the real tools: the live `/metrics` of a
//! worker under load passes `promtool check metrics`; a real Prometheus
//! scrapes it and every expression of the Grafana dashboard returns data;
//! the alert rules pass `promtool`; each database gauge moves when its
//! condition is created; `/ready` follows the database and the listener.
//!
//! Prometheus and promtool must be installed (Debian/Ubuntu:
//! `apt-get install prometheus`; `.ci/run` does it): without them these
//! tests fail, they never skip.
//!
//! The metrics recorder is process-global, so every worker of this binary
//! exports into the same `/metrics`; only the load test runs jobs.

mod common;
#[path = "observability/dashboard.rs"]
mod dashboard;
#[path = "observability/http.rs"]
mod http;
#[path = "observability/load.rs"]
mod load;
#[path = "observability/otlp.rs"]
mod otlp;
#[path = "observability/prometheus.rs"]
mod prometheus;
#[path = "observability/promql.rs"]
mod promql;
#[path = "observability/traces.rs"]
mod traces;

use std::collections::{BTreeSet, HashMap};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dashboard::{grafana_dir, Dashboard};
use http::Endpoint;
use load::{until_exported, Load};
use pgwake::internal::sampler::{sample, Sample, Sampler, DEPTH_CAP_DEFAULT};
use pgwake::{Worker, WorkerConfig};
use prometheus::{promtool_check_metrics, tool, Prometheus};
use promql::metric_names;

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------- the tests

#[tokio::test]
async fn a_loaded_worker_passes_promtool_and_feeds_every_dashboard_expression_in_prometheus() {
    let dashboard = Dashboard::load();
    let db = migrated_db().await;
    let load = Load::start(&db).await;

    // 1. Everything the dashboard names is exported, and the live exposition
    // passes promtool's linter.
    let wanted = dashboard.metric_names();
    let exposition = until_exported(load.endpoint, &wanted).await;
    let (ok, findings) = promtool_check_metrics(&exposition);
    assert!(
        ok && findings.is_empty(),
        "promtool check metrics failed on the live exposition:\n{findings}\n--- exposition ---\n{exposition}"
    );

    // 2. A real Prometheus scrapes the worker; every dashboard expression
    // returns data that is not NaN, and the alert rules evaluate cleanly.
    let prometheus = Prometheus::start(load.endpoint, &[grafana_dir().join("alerts.yml")]).await;
    prometheus.until_up().await;
    let checked = prometheus.until_dashboard_has_data(&dashboard).await;
    prometheus.until_rules_evaluate_cleanly().await;
    println!(
        "checked {checked} dashboard expressions ({} panel targets, {} variables) naming {} metrics",
        dashboard.targets.len(),
        dashboard.variables.len(),
        wanted.len()
    );
    drop(prometheus);

    load.finish(&db).await;
}

#[test]
fn every_metric_a_dashboard_expression_names_is_found() {
    // The check above is only as good as this parser: a metric the worker
    // does not export must be caught wherever the expression names it.
    let cases: &[(&str, &[&str])] = &[
        (
            r#"sum by (outcome) (rate(pgwake_jobs_total{queue=~".*",outcome!="done"}[1m]))"#,
            &["pgwake_jobs_total"],
        ),
        (
            r#"histogram_quantile(0.95, sum by (le) (rate(pgwake_job_pickup_latency_seconds_bucket[5m])))"#,
            &["pgwake_job_pickup_latency_seconds_bucket"],
        ),
        (
            "max(pgwake_a) / on() group_left max(pgwake_b) or on() vector(0)",
            &["pgwake_a", "pgwake_b"],
        ),
        (
            "sum(rate(x_total[5m] offset 1h)) by (queue) > bool 0 unless y",
            &["x_total", "y"],
        ),
        (
            r#"count(pgwake_z{job="a b,c", le="+Inf"}) and absent(nope_total)"#,
            &["pgwake_z", "nope_total"],
        ),
    ];
    for (expr, want) in cases {
        let got = metric_names(expr);
        let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
        assert_eq!(got, want, "metric names of {expr}");
    }
}

/// The dashboard works both ways Grafana loads one: imported in the UI and
/// provisioned from a file (the Kubernetes sidecar), where import-time
/// inputs (`__inputs`, `${DS_…}`) are never resolved. So its data source is
/// a template variable of type `datasource`, and every panel, target,
/// annotation and variable reads through it.
#[test]
fn the_dashboard_reads_its_data_source_from_a_template_variable_so_file_provisioning_works() {
    let path = grafana_dir().join("pgwake-dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(
        json.get("__inputs").is_none(),
        "__inputs are resolved only by a UI import"
    );
    assert!(
        !text.contains("${DS_"),
        "an import-time input is referenced"
    );
    let vars = json["templating"]["list"].as_array().unwrap();
    let ds: Vec<&serde_json::Value> = vars.iter().filter(|v| v["type"] == "datasource").collect();
    assert_eq!(ds.len(), 1, "one data source variable");
    assert_eq!(ds[0]["query"], "prometheus");
    let name = ds[0]["name"].as_str().unwrap();
    let want = serde_json::json!({"type": "prometheus", "uid": format!("${{{name}}}")});
    let mut refs = Vec::new();
    fn collect<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    if k == "datasource" {
                        out.push(x);
                    }
                    collect(x, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| collect(x, out)),
            _ => {}
        }
    }
    collect(&json, &mut refs);
    let own: Vec<_> = refs
        .iter()
        .filter(|r| r["type"] != "grafana" && r["type"] != "datasource")
        .collect();
    assert!(own.len() > 10, "{own:?}");
    for r in own {
        assert_eq!(**r, want, "a data source reference not through ${name}");
    }
}

#[tokio::test]
async fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let dir = grafana_dir();
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
    ] {
        let out = Command::new(tool("promtool"))
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn queue_depth_counts_ready_scheduled_and_dead_jobs_per_queue_leaving_out_running_claims() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Five ready emails, waiting 2 h, 1 h and (three) just now; the last
    // one at a lower priority.
    let emails: Vec<i64> = client
        .query(
            "INSERT INTO pgwake.jobs (queue, task, priority, created_at, run_at)
             SELECT 'emails', 'send', CASE WHEN g = 5 THEN 5 ELSE 0 END,
                    now() - make_interval(hours => greatest(0, 3 - g)),
                    now() - make_interval(hours => greatest(0, 3 - g))
             FROM generate_series(1, 5) g
             ORDER BY g
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    client
        .batch_execute(
            "INSERT INTO pgwake.jobs (queue, task, run_at)
             SELECT 'emails', 'send', now() + interval '1 day' FROM generate_series(1, 2);
             INSERT INTO pgwake.jobs (queue, task) SELECT 'reports', 'build' FROM generate_series(1, 2);
             INSERT INTO pgwake.jobs (queue, task, run_at) VALUES ('reports', 'build', '-infinity');
             INSERT INTO pgwake.dead_jobs
                 (id, queue, task, payload, priority, run_at, attempts, max_attempts, created_at)
             SELECT 1000000 + g, 'webhooks', 'post', '{}', 0, now(), 2, 2, now()
             FROM generate_series(1, 2) g;",
        )
        .await
        .unwrap();
    let pool = sampler_pool(&db);

    let s = queues(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
    assert_eq!(s["emails"], (5, 2, 0), "emails: ready, scheduled, dead");
    assert_eq!(s["reports"], (3, 0, 0), "reports");
    assert_eq!(
        s["webhooks"],
        (0, 0, 2),
        "a queue with only dead jobs is reported"
    );
    let oldest = oldest_ready_age(&pool, "emails").await;
    assert!(
        oldest >= 7200.0,
        "the 2 h old job is the oldest ready: {oldest}"
    );
    // A job enqueued just now with a run_at long past has waited since it
    // was enqueued.
    let oldest = oldest_ready_age(&pool, "reports").await;
    assert!(
        (0.0..3600.0).contains(&oldest),
        "reports were all enqueued just now: {oldest}"
    );

    // A tx-mode claim in progress holds the oldest email and the one at the
    // lower priority.
    let mut claimer = db.client().await;
    let claim = claimer.transaction().await.unwrap();
    let claimed = claim
        .execute(
            "DELETE FROM pgwake.jobs WHERE id = ANY($1)",
            &[&vec![emails[0], emails[4]]],
        )
        .await
        .unwrap();
    assert_eq!(claimed, 2);
    let s = queues(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
    assert_eq!(s["emails"], (3, 2, 0), "running claims are not ready");
    assert_eq!(s["reports"], (3, 0, 0));
    let oldest = oldest_ready_age(&pool, "emails").await;
    assert!(
        (3600.0..7200.0).contains(&oldest),
        "the oldest ready job not being run is 1 h old: {oldest}"
    );

    // The claim rolls back (the worker died): its jobs are ready again.
    claim.rollback().await.unwrap();
    let s = queues(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
    assert_eq!(
        s["emails"],
        (5, 2, 0),
        "a rolled-back claim's jobs are ready again"
    );
}

#[tokio::test]
async fn queue_settings_gauges_follow_pause_resume_and_the_max_running_and_rate_limits() {
    let db = migrated_db().await;
    let client = db.client().await;
    let pool = sampler_pool(&db);
    let handle = pgwake::metrics::install();
    let mut sampler = Sampler::new(
        pool.clone(),
        pgwake::internal::sampler::SamplerConfig::every(Duration::from_secs(3600)),
        Arc::new(pgwake::Health::new(false)),
    );
    // The recorder is process-global: queue names no other test uses.
    let (limited, held) = ("obs-settings-limited", "obs-settings-held");
    let mut publish = async || {
        sampler.publish(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
        let text = handle.render();
        [
            queue_gauge(&text, "pgwake_queue_max_running", limited),
            queue_gauge(&text, "pgwake_queue_paused", limited),
            queue_gauge(&text, "pgwake_queue_max_running", held),
            queue_gauge(&text, "pgwake_queue_paused", held),
        ]
    };
    // Before any setting: no series.
    assert_eq!(publish().await, [None, None, None, None]);

    pgwake::admin::queues::set_max_running(&client, limited, Some(3))
        .await
        .unwrap();
    pgwake::admin::queues::pause(&client, held).await.unwrap();
    // [limited: max running, paused; held: max running, paused]
    assert_eq!(publish().await, [Some(3.0), None, None, Some(1.0)]);

    // Lowered: the gauge follows.
    pgwake::admin::queues::set_max_running(&client, limited, Some(1))
        .await
        .unwrap();
    assert_eq!(publish().await, [Some(1.0), None, None, Some(1.0)]);

    // Removed and resumed: 0, which no limit can be (max_running > 0), and
    // not paused.
    pgwake::admin::queues::set_max_running(&client, limited, None)
        .await
        .unwrap();
    pgwake::admin::queues::resume(&client, held).await.unwrap();
    assert_eq!(publish().await, [Some(0.0), None, None, Some(0.0)]);

    // Set again: back.
    pgwake::admin::queues::set_max_running(&client, limited, Some(2))
        .await
        .unwrap();
    assert_eq!(publish().await, [Some(2.0), None, None, Some(0.0)]);

    // A rate limit, in admissions per second whatever its window; 0 once
    // removed.
    let mut rate = async |r: Option<&str>| {
        pgwake::admin::queues::set_rate(&client, held, r.map(|r| r.parse().unwrap()))
            .await
            .unwrap();
        sampler.publish(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
        queue_gauge(&handle.render(), "pgwake_queue_rate_limit", held)
    };
    assert_eq!(rate(Some("20/s")).await, Some(20.0));
    assert_eq!(rate(Some("600/min")).await, Some(10.0));
    assert_eq!(rate(Some("1/4s")).await, Some(0.25));
    assert_eq!(rate(None).await, Some(0.0));

    // A per-key running limit (issue 24); 0 once removed.
    let mut per_key = async |n: Option<i32>| {
        pgwake::admin::queues::set_max_running_per_key(&client, held, n)
            .await
            .unwrap();
        sampler.publish(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
        queue_gauge(&handle.render(), "pgwake_queue_max_running_per_key", held)
    };
    assert_eq!(per_key(Some(3)).await, Some(3.0));
    assert_eq!(per_key(None).await, Some(0.0));

    // A per-key rate, in admissions per second of one key; 0 once removed.
    let mut key_rate = async |r: Option<&str>| {
        pgwake::admin::queues::set_rate_per_key(&client, held, r.map(|r| r.parse().unwrap()))
            .await
            .unwrap();
        sampler.publish(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
        queue_gauge(&handle.render(), "pgwake_queue_rate_per_key_limit", held)
    };
    assert_eq!(key_rate(Some("10/s")).await, Some(10.0));
    assert_eq!(key_rate(Some("30/min")).await, Some(0.5));
    assert_eq!(key_rate(None).await, Some(0.0));

    // Fair keys: 1 while on, 0 once off.
    let mut fair = async |on: bool| {
        pgwake::admin::queues::set_fair_keys(&client, held, on)
            .await
            .unwrap();
        sampler.publish(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap());
        queue_gauge(&handle.render(), "pgwake_queue_fair_keys", held)
    };
    assert_eq!(fair(true).await, Some(1.0));
    assert_eq!(fair(false).await, Some(0.0));
}

#[tokio::test]
async fn queue_depth_stops_counting_at_the_cap() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO pgwake.jobs (queue, task, priority)
             SELECT 'bulk', 'send', g % 3 FROM generate_series(1, 50) g;
             INSERT INTO pgwake.jobs (queue, task, priority, run_at)
             SELECT 'bulk', 'send', g % 3, now() + interval '1 hour' FROM generate_series(1, 20) g;",
        )
        .await
        .unwrap();
    let pool = sampler_pool(&db);
    let capped = queues(&sample(&pool, 10).await.unwrap());
    assert_eq!(capped["bulk"], (10, 10, 0), "every count stops at the cap");
    let exact = queues(&sample(&pool, i64::MAX).await.unwrap());
    assert_eq!(
        exact["bulk"],
        (50, 20, 0),
        "without a cap, over every priority"
    );
}

/// The waiting jobs by reason read at most the cap's rows of each table
/// (the depth cap, or `WAITING_CAP` when lower): 8 snoozed and 8 held jobs
/// count 5 each under a cap of 5, and 8 with the default one.
#[tokio::test]
async fn waiting_jobs_by_reason_stop_counting_at_the_cap() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "WITH j AS (INSERT INTO pgwake.jobs (queue, task, run_at)
                        SELECT 'bulk', 'send', now() + interval '1 hour' FROM generate_series(1, 8)
                        RETURNING id, run_at)
             INSERT INTO pgwake.job_snoozes (job_id, snoozes, snoozed_until)
             SELECT id, 1, run_at FROM j;
             SELECT pgwake.enqueue('child', queue => 'bulk',
                                   after => ARRAY[pgwake.enqueue('parent', queue => 'other')])
             FROM generate_series(1, 8);",
        )
        .await
        .unwrap();
    let pool = sampler_pool(&db);
    let waiting = |s: &Sample| {
        let mut w: Vec<(String, String, i64)> = s.waiting.clone();
        w.sort();
        w
    };
    let row = |reason: &str, n: i64| ("bulk".to_string(), reason.to_string(), n);
    assert_eq!(
        waiting(&sample(&pool, 5).await.unwrap()),
        [row("parents", 5), row("snoozed", 5)]
    );
    assert_eq!(
        waiting(&sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap()),
        [row("parents", 8), row("snoozed", 8)]
    );
}

#[tokio::test]
async fn a_session_idle_in_transaction_raises_the_idle_and_oldest_transaction_gauges() {
    const APP: &str = "obs-idle-report-tool";
    let db = migrated_db().await;
    let pool = sampler_pool(&db);
    let before = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap();
    assert!(
        before.idle_in_transaction.is_empty(),
        "a fresh database has no session idle in transaction: {:?}",
        before.idle_in_transaction
    );
    assert_eq!(before.idle_in_transaction_max_age, 0.0);

    let idle = connect_as(&db, APP).await;
    idle.batch_execute("BEGIN; SELECT txid_current();")
        .await
        .unwrap();
    let age = idle_transaction_age(&db, APP).await;
    let after = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap();
    assert_eq!(after.idle_in_transaction, vec![(APP.to_string(), 1)]);
    assert!(
        after.idle_in_transaction_max_age >= age,
        "idle max age {} covers the session's age {age} read before it",
        after.idle_in_transaction_max_age
    );
    assert!(
        after.oldest_transaction_age >= age,
        "oldest transaction age {} covers the session's age {age}",
        after.oldest_transaction_age
    );

    // The session ends its transaction: the gauges fall back.
    idle.batch_execute("ROLLBACK").await.unwrap();
    let s = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap();
    assert!(
        s.idle_in_transaction.is_empty(),
        "{:?}",
        s.idle_in_transaction
    );
    assert_eq!(s.idle_in_transaction_max_age, 0.0);
}

/// A transaction in another database of the cluster does not hold back
/// this database's vacuum horizon, so it is not this database's oldest
/// transaction: counted, it made claims resume after their cursor (as under
/// pressure) for nothing. Fails when the gauge reads every database.
#[tokio::test]
async fn a_transaction_in_another_database_is_not_the_oldest_transaction() {
    const APP: &str = "obs-other-database-tool";
    let db = migrated_db().await;
    let other = migrated_db().await;
    let pool = sampler_pool(&db);
    let idle = connect_as(&other, APP).await;
    idle.batch_execute("BEGIN; SELECT txid_current();")
        .await
        .unwrap();
    // Old enough to stand out from this database's own sessions (the
    // sampler's, a few milliseconds into their statements).
    wait_for(
        "the other database's transaction to age",
        DEADLINE,
        async || {
            let age = idle_transaction_age(&other, APP).await;
            (age >= 1.0).then_some(()).ok_or(format!("{age} s"))
        },
    )
    .await;
    let s = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap();
    assert!(
        s.oldest_transaction_age < 1.0,
        "a transaction in another database counted as this one's oldest: {} s",
        s.oldest_transaction_age
    );
    idle.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_listener_stuck_in_a_transaction_raises_the_notification_queue_usage() {
    let db = migrated_db().await;
    let pool = sampler_pool(&db);
    let before = sample(&pool, DEPTH_CAP_DEFAULT)
        .await
        .unwrap()
        .notification_queue_usage;

    // A session LISTENs, then stays in a transaction: it cannot consume, so
    // the server cannot truncate the queue behind it.
    let stuck = connect_as(&db, "obs-stuck-listener").await;
    // (Two calls: in one query string the LISTEN would join the transaction
    // and not take effect until it commits.)
    stuck.batch_execute("LISTEN obs_stuck").await.unwrap();
    stuck.batch_execute("BEGIN; SELECT 1").await.unwrap();
    // About 1.4 MB of distinct notifications: some 170 queue pages.
    db.client()
        .await
        .batch_execute(
            "SELECT pg_notify('obs_stuck', repeat('x', 7000) || g) FROM generate_series(1, 200) g",
        )
        .await
        .unwrap();
    let after = sample(&pool, DEPTH_CAP_DEFAULT)
        .await
        .unwrap()
        .notification_queue_usage;
    assert!(
        after > before && after > 0.0,
        "NOTIFY queue usage rises while a listener is stuck: {before} -> {after}"
    );
    stuck.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn deleted_jobs_raise_the_queue_table_dead_tuples() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Autovacuum would reset the count at a moment of its choosing.
    client
        .batch_execute("ALTER TABLE pgwake.jobs SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let pool = sampler_pool(&db);
    let before = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap().dead_tuples;

    let deleter = db.client().await;
    deleter
        .batch_execute(
            "INSERT INTO pgwake.jobs (queue, task) SELECT 'q', 't' FROM generate_series(1, 500);
             DELETE FROM pgwake.jobs;",
        )
        .await
        .unwrap();
    // A backend publishes its table statistics when it goes idle, at most
    // once a second, and when it exits: end it.
    drop(deleter);
    wait_for(
        "the dead tuples of pgwake.jobs to rise",
        DEADLINE,
        async || {
            let dead = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap().dead_tuples;
            if dead >= before + 500 {
                Ok(())
            } else {
                Err(format!("{dead} dead tuples (before: {before})"))
            }
        },
    )
    .await;
}

#[tokio::test]
async fn ready_is_503_while_the_listener_is_down_and_200_once_it_is_back() {
    const APP: &str = "obs-ready-listener";
    let db = migrated_db().await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            application_name: APP.into(),
            sample_interval: Some(Duration::from_millis(100)),
            ..test_config()
        })
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let endpoint = Endpoint::serve(&worker).await;
    let w = Running::start(worker);
    endpoint.until_ready(200, "up").await;
    assert_eq!(endpoint.get("/health").await, (200, "ok\n".to_string()));

    // New connections to the database are refused and the listener's
    // connection is cut: it cannot come back until they are allowed again.
    let admin = admin_client().await;
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS false",
            db.name
        ))
        .await
        .unwrap();
    let killed: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
             WHERE datname = $1 AND application_name = $2",
            &[&db.name, &format!("{APP}-listener")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(killed, 1, "the worker's listener backend");
    let (_, body) = endpoint.until_ready(503, "listener down").await;
    assert!(
        body.contains("listener: down") && body.contains("database: up"),
        "{body}"
    );
    assert_eq!(endpoint.get("/health").await.0, 200, "the process is alive");

    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH ALLOW_CONNECTIONS true",
            db.name
        ))
        .await
        .unwrap();
    endpoint.until_ready(200, "listener reconnected").await;
    w.shutdown().await;
}

#[tokio::test]
async fn ready_is_503_while_the_database_is_down_and_200_once_it_is_back() {
    let (cluster, db) = private_cluster_db().await;
    let cluster = Arc::new(cluster);
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            application_name: "obs-ready-db".into(),
            sample_interval: Some(Duration::from_millis(100)),
            ..test_config()
        })
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let endpoint = Endpoint::serve(&worker).await;
    let w = Running::start(worker);
    endpoint.until_ready(200, "up").await;

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop("fast"))
        .await
        .unwrap()
        .unwrap();
    let (_, body) = endpoint.until_ready(503, "database down").await;
    assert!(body.contains("database: down"), "{body}");
    assert_eq!(endpoint.get("/health").await.0, 200, "the process is alive");

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_again())
        .await
        .unwrap()
        .unwrap();
    let (_, body) = endpoint.until_ready(200, "database back").await;
    assert_eq!(body, "database: up\nlistener: up\n");
    w.shutdown().await;
}

/// A fresh worker, before any job, schedule or idle session exists: the
/// first scrape once it is ready has every metric the dashboard and the
/// alert rules name, so a new install shows zeros, not "No data", and
/// `rate()`/`increase()` have a starting point.
#[tokio::test]
async fn a_fresh_worker_exports_every_metric_the_dashboard_and_the_alerts_name_from_the_first_scrape(
) {
    let db = migrated_db().await;
    let mut wanted = Dashboard::load().metric_names();
    wanted.extend(alert_metric_names());
    // A histogram's series: the dashboard names `_bucket`, `_sum`, `_count`.
    let mut child = spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]);
    let log = tail_stderr(&mut child);
    let addr = wait_for("the worker's address", DEADLINE, async || {
        let log = log.lock().unwrap().clone();
        served_addr(&log).ok_or(log)
    })
    .await;
    wait_for("/ready", DEADLINE, async || {
        match http::http_get(addr, "/ready").await {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let (status, text) = http::http_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    let exported = load::exported_names(&text);
    let missing: Vec<_> = wanted
        .iter()
        .filter(|m| !m.starts_with("absent") && !exported.contains(*m))
        .collect();
    assert!(
        missing.is_empty(),
        "missing on the first scrape: {missing:?}\n--- exposition ---\n{text}"
    );
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// Metric names the alert rules' expressions read (`grafana/alerts.yml`).
fn alert_metric_names() -> BTreeSet<String> {
    let rules = std::fs::read_to_string(grafana_dir().join("alerts.yml")).unwrap();
    let names: BTreeSet<String> = rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .flat_map(|e| metric_names(e.trim()))
        .filter(|m| m != "up")
        .collect();
    assert!(names.len() >= 5, "{names:?}");
    names
}

/// Jobs of a task no live worker has a handler for show in
/// `pgwake_jobs_unserved` (the `PgwakeJobsUnserved` alert's input).
#[tokio::test]
async fn jobs_of_a_task_no_live_worker_serves_raise_the_unserved_gauge() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute("INSERT INTO pgwake.jobs (task) VALUES ('other'), ('other'), ('t')")
        .await
        .unwrap();
    let mut child = spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]);
    let log = tail_stderr(&mut child);
    let addr = wait_for("the worker's address", DEADLINE, async || {
        let log = log.lock().unwrap().clone();
        served_addr(&log).ok_or(log)
    })
    .await;
    wait_for("the unserved gauge", DEADLINE, async || {
        let (_, text) = http::http_get(addr, "/metrics")
            .await
            .map_err(|e| e.to_string())?;
        let line = text
            .lines()
            .find(|l| l.starts_with("pgwake_jobs_unserved{") && l.contains("task=\"other\""));
        match line {
            Some(l) if l.ends_with(" 2") && l.contains("queue=\"default\"") => Ok(()),
            _ => Err(text),
        }
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// `pgwake run` started before its database (a host booting, a pod whose
/// database comes up later) waits for it: it says what it waits for, `/ready`
/// answers 503 and `/health` 200 meanwhile, and once the server is up it
/// runs the jobs. `--fail-fast` exits 1 instead; SIGTERM while waiting is a
/// clean stop.
#[tokio::test]
async fn a_worker_started_before_its_database_waits_for_it_then_runs_the_jobs() {
    let (cluster, db) = private_cluster_db().await;
    let cluster = Arc::new(cluster);
    insert_jobs(&db, "t", 3).await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop("fast"))
        .await
        .unwrap()
        .unwrap();

    // --fail-fast: today's behaviour, exit 1 naming the database.
    let out = run_pgwake(
        &[
            "run",
            "--fail-fast",
            "--metrics-addr",
            "127.0.0.1:0",
            "--handler",
            "t=exec:true",
        ],
        Some(&db.url),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));

    let mut child = spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]);
    let log = tail_stderr(&mut child);
    let addr = wait_for(
        "the worker to wait for its database",
        DEADLINE,
        async || {
            let log = log.lock().unwrap().clone();
            if !log.contains("waiting for the database") {
                return Err(log);
            }
            served_addr(&log).ok_or(log)
        },
    )
    .await;
    let (status, body) = http::http_get(addr, "/ready").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("database: down"), "{body}");
    assert_eq!(http::http_get(addr, "/health").await.unwrap().0, 200);

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_again())
        .await
        .unwrap()
        .unwrap();
    let client = db.client().await;
    eventually("the jobs ran", DEADLINE, || async {
        let left: i64 = client
            .query_one("SELECT count(*) FROM pgwake.jobs", &[])
            .await
            .unwrap()
            .get(0);
        left == 0
    })
    .await;
    assert_eq!(http::http_get(addr, "/ready").await.unwrap().0, 200);
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());

    // Stopped while it waits: a clean exit, not an error.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop("fast"))
        .await
        .unwrap()
        .unwrap();
    let mut child = spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]);
    let log = tail_stderr(&mut child);
    wait_for("the worker to wait again", DEADLINE, async || {
        let log = log.lock().unwrap().clone();
        if log.contains("waiting for the database") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// `pgwake run` started on a database never migrated (a Deployment applied
/// beside its migrate Job, a worker unit beside `pgwake-migrate.service`)
/// waits for the schema: a log line says to run `pgwake migrate`, `/ready`
/// answers 503 saying why, and once a real `pgwake migrate` has run it
/// becomes ready and runs the jobs. Before issue 33 item 17 it exited 1 at
/// once. `--fail-fast` still exits 1 (tests/cli/cli.rs).
#[tokio::test]
async fn a_worker_started_before_its_schema_exists_waits_for_migrate_then_runs_the_jobs() {
    let db = empty_db().await;
    let mut worker = KillOnDrop::new(spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]));
    let log = tail_stderr(worker.child());
    let addr = wait_for("the worker to wait for its schema", DEADLINE, async || {
        let log = log.lock().unwrap().clone();
        if let Some(status) = worker.exited() {
            panic!("the worker exited ({status}) instead of waiting:\n{log}");
        }
        let says = log.lines().any(|l| {
            l.contains("waiting for the schema")
                && l.contains("schema is missing")
                && l.contains("run `pgwake migrate`")
        });
        if !says {
            return Err(log);
        }
        served_addr(&log).ok_or(log)
    })
    .await;
    let (status, body) = http::http_get(addr, "/ready").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("database: up")
            && body.contains("schema: waiting")
            && body.contains("missing"),
        "{body}"
    );
    assert_eq!(http::http_get(addr, "/health").await.unwrap().0, 200);

    let out = run_pgwake(&["migrate"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    insert_jobs(&db, "t", 3).await;
    let client = db.client().await;
    eventually("the jobs ran", DEADLINE, || async {
        let left: i64 = client
            .query_one("SELECT count(*) FROM pgwake.jobs", &[])
            .await
            .unwrap()
            .get(0);
        left == 0
    })
    .await;
    let (status, body) = http::http_get(addr, "/ready").await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, "database: up\nlistener: up\n")
    );
    send_signal(worker.child(), libc::SIGTERM);
    let out = wait_exit(worker.take(), DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());

    // Stopped while it waits for the schema: a clean exit.
    let db = empty_db().await;
    let mut worker = KillOnDrop::new(spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]));
    let log = tail_stderr(worker.child());
    wait_for("the worker to wait again", DEADLINE, async || {
        let log = log.lock().unwrap().clone();
        if log.contains("waiting for the schema") {
            Ok(())
        } else {
            Err(log)
        }
    })
    .await;
    send_signal(worker.child(), libc::SIGTERM);
    let out = wait_exit(worker.take(), DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// `pgwake run` started while a real `pgwake migrate` upgrades its schema
/// (here from version 16, the migrate held mid-way by its own lock, which
/// the test takes first) waits for it, naming both versions, with `/ready`
/// 503, then starts and runs the jobs once the migrate is done. Before
/// issue 33 item 17 it exited 1 with "the pgwake schema is at version 16,
/// this pgwake needs N".
#[tokio::test]
async fn a_worker_started_during_a_migration_waits_for_it_then_runs_the_jobs() {
    let latest = pgwake::admin::schema::latest_version();
    let db = schema_at(16).await;
    let lock = db.client().await;
    lock.execute(
        "SELECT pg_advisory_lock($1)",
        &[&pgwake::admin::schema::MIGRATE_LOCK_KEY],
    )
    .await
    .unwrap();
    let mut worker = KillOnDrop::new(spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]));
    let log = tail_stderr(worker.child());
    let versions = format!("at version 16, this pgwake needs {latest}");
    let addr = wait_for(
        "the worker to wait for the migration",
        DEADLINE,
        async || {
            let log = log.lock().unwrap().clone();
            if let Some(status) = worker.exited() {
                panic!("the worker exited ({status}) instead of waiting:\n{log}");
            }
            let says = log.lines().any(|l| {
                l.contains("waiting for the schema")
                    && l.contains("`pgwake migrate` is running")
                    && l.contains(&versions)
            });
            if !says {
                return Err(log);
            }
            served_addr(&log).ok_or(log)
        },
    )
    .await;
    let (status, body) = http::http_get(addr, "/ready").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(&versions), "{body}");

    // The migrate starts and waits for its lock, as one started by a second
    // deploy would behind the first.
    let mut migrate = pgwake_cmd();
    migrate
        .env("DATABASE_URL", &db.url)
        .arg("migrate")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut migrate = KillOnDrop::new(migrate.spawn().unwrap());
    let admin = db.client().await;
    // It tries the lock again and again (holding nothing between tries,
    // src/admin/schema.rs): its session's last statement is the try.
    eventually("the migrate to queue for its lock", DEADLINE, || async {
        let waiting: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()
                   AND query LIKE '%pg_try_advisory_lock(%'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        waiting == 1
    })
    .await;
    // A few more checks of the worker's (100 ms doubling, 2 s at most).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(migrate.exited().is_none(), "the migrate did not wait");
    if let Some(status) = worker.exited() {
        panic!(
            "the worker exited ({status}) during the migration:\n{}",
            log.lock().unwrap()
        );
    }
    assert_eq!(http::http_get(addr, "/ready").await.unwrap().0, 503);

    drop(lock);
    let out = wait_exit(migrate.take(), DEADLINE).await;
    assert!(out.status.success(), "{}", stderr_of(&out));
    let version: i32 = db
        .scalar("SELECT max(version) FROM pgwake.schema_migrations")
        .await;
    assert_eq!(version, latest);
    insert_jobs(&db, "t", 3).await;
    eventually("the jobs ran", DEADLINE, || async {
        let left: i64 = admin
            .query_one("SELECT count(*) FROM pgwake.jobs", &[])
            .await
            .unwrap()
            .get(0);
        left == 0
    })
    .await;
    assert_eq!(http::http_get(addr, "/ready").await.unwrap().0, 200);
    send_signal(worker.child(), libc::SIGTERM);
    let out = wait_exit(worker.take(), DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// A schema newer than the binary is the one schema a worker does not wait
/// for: a newer pgwake migrated it, and only a newer pgwake can use it, so
/// `pgwake run` exits 2 (the code the systemd unit does not restart on),
/// naming both versions, with or without `--fail-fast`.
#[tokio::test]
async fn a_worker_on_a_schema_newer_than_itself_exits_2_naming_both_versions() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO pgwake.schema_migrations (version, name) VALUES (999, 'future.sql')",
        )
        .await
        .unwrap();
    let latest = pgwake::admin::schema::latest_version();
    for extra in [&[][..], &["--fail-fast"][..]] {
        let mut args = vec![
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--handler",
            "t=exec:true",
        ];
        args.extend(extra);
        let out = run_pgwake(&args, Some(&db.url));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(&format!(
                "at version 999, newer than this pgwake knows ({latest}); upgrade pgwake"
            )),
            "{err}"
        );
    }
}

/// A worker's `/metrics` shows flows and waits (issue 37, item 5): a
/// child its parent released is observed once in
/// `pgwake_flow_release_latency_seconds` when it is claimed, in both
/// delivery modes, and its parent (which no parent released) is not; and
/// `pgwake_jobs_waiting` counts, per queue, the jobs snoozed, sleeping,
/// waiting for a signal and held for their parents, then drops to 0 when
/// they no longer wait.
#[tokio::test]
async fn metrics_show_flow_release_latency_and_waiting_jobs_by_reason() {
    let db = migrated_db().await;
    let c = db.client().await;
    // Queue `w` (no worker works it): one job of each kind of wait.
    c.batch_execute(
        "SELECT pgwake.enqueue('held', queue => 'w',
                               after => ARRAY[pgwake.enqueue('blocker', queue => 'w')]);
         WITH j AS (INSERT INTO pgwake.jobs (queue, task, run_at)
                    VALUES ('w', 'snoozed', now() + interval '1 day') RETURNING id, run_at)
         INSERT INTO pgwake.job_snoozes (job_id, snoozes, snoozed_until) SELECT id, 1, run_at FROM j;
         WITH j AS (INSERT INTO pgwake.jobs (queue, task, run_at)
                    VALUES ('w', 'sleeping', now() + interval '1 day') RETURNING id, run_at)
         INSERT INTO pgwake.job_waits (job_id, kind, wait_until, waits) SELECT id, 'sleep', run_at, 1 FROM j;
         WITH j AS (INSERT INTO pgwake.jobs (queue, task, run_at)
                    VALUES ('w', 'signalled', now() + interval '1 day') RETURNING id, run_at)
         INSERT INTO pgwake.job_waits (job_id, kind, wait_until, waits, signal_key, signal_state)
         SELECT id, 'signal', run_at, 1, 'payment:1', 'waiting' FROM j;",
    )
    .await
    .unwrap();
    // A parent and its child in a lease-mode queue and in a tx-mode one.
    for queue in ["leased", "txq"] {
        c.execute(
            "SELECT pgwake.flow(jsonb_build_array(
                 jsonb_build_object('name', 'p', 'task', 't', 'queue', $1::text),
                 jsonb_build_object('name', 'c', 'task', 't', 'queue', $1::text, 'after', '[\"p\"]'::jsonb)))",
            &[&queue],
        )
        .await
        .unwrap();
    }
    let mut child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            "t=exec:true",
            "--queues",
            "leased,txq",
            "--tx-queues",
            "txq",
            "--sample-interval",
            "200ms",
        ],
    );
    let log = tail_stderr(&mut child);
    let addr = wait_for("the worker's address", DEADLINE, async || {
        let log = log.lock().unwrap().clone();
        served_addr(&log).ok_or(log)
    })
    .await;
    let scrape = async || {
        http::http_get(addr, "/metrics")
            .await
            .map(|(_, t)| t)
            .unwrap_or_default()
    };
    let series = |text: &str, s: &str| -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{s} ")))
            .map(|v| v.trim().parse().unwrap())
    };
    // Every job of both flows has run: each child observed once.
    let text = wait_for("both children claimed", DEADLINE, async || {
        let left: i64 = db
            .scalar("SELECT count(*) FROM pgwake.jobs WHERE queue <> 'w'")
            .await;
        let text = scrape().await;
        let counts = ["leased", "txq"].map(|q| {
            series(
                &text,
                &format!("pgwake_flow_release_latency_seconds_count{{queue=\"{q}\"}}"),
            )
        });
        if left == 0 && counts.iter().all(|n| n.is_some_and(|n| n > 0.0)) {
            Ok(text)
        } else {
            Err(format!("{left} jobs left, counts {counts:?}"))
        }
    })
    .await;
    for q in ["leased", "txq"] {
        assert_eq!(
            series(
                &text,
                &format!("pgwake_flow_release_latency_seconds_count{{queue=\"{q}\"}}")
            ),
            Some(1.0),
            "the child only, not its parent: {text}"
        );
        let sum = series(
            &text,
            &format!("pgwake_flow_release_latency_seconds_sum{{queue=\"{q}\"}}"),
        )
        .unwrap();
        assert!(sum >= 0.0, "{sum}");
    }
    // The waits, sampled.
    let waiting = |text: &str, reason: &str| {
        series(
            text,
            &format!("pgwake_jobs_waiting{{queue=\"w\",reason=\"{reason}\"}}"),
        )
    };
    wait_for("the waiting gauges", DEADLINE, async || {
        let text = scrape().await;
        let got = ["snoozed", "sleeping", "signal", "parents"].map(|r| waiting(&text, r));
        if got.iter().all(|n| *n == Some(1.0)) {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    // They stop waiting (their rows go): each drops to 0.
    c.batch_execute("DELETE FROM pgwake.jobs WHERE queue = 'w' AND task <> 'blocker'")
        .await
        .unwrap();
    wait_for("the waiting gauges at 0", DEADLINE, async || {
        let text = scrape().await;
        let got = ["snoozed", "sleeping", "signal", "parents"].map(|r| waiting(&text, r));
        if got.iter().all(|n| *n == Some(0.0)) {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, DEADLINE).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
}

/// The address a `pgwake run` log says it serves `/metrics` on.
fn served_addr(log: &str) -> Option<std::net::SocketAddr> {
    let line = log.lines().find(|l| l.contains("serving /metrics"))?;
    let at = line.find("addr=")? + "addr=".len();
    line[at..].split_whitespace().next()?.parse().ok()
}

// ---------------------------------------------------------------- helpers

/// A small pool for calling the sampler directly.
fn sampler_pool(db: &TestDb) -> deadpool_postgres::Pool {
    pgwake::connect::pool(&db.config(), 2).unwrap()
}

/// The value of `metric{queue="<queue>"}` in a text exposition.
fn queue_gauge(text: &str, metric: &str, queue: &str) -> Option<f64> {
    let series = format!("{metric}{{queue=\"{queue}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.trim().parse().unwrap())
}

/// Per queue: (ready, scheduled, dead).
fn queues(s: &Sample) -> HashMap<String, (i64, i64, i64)> {
    s.queues
        .iter()
        .map(|q| (q.queue.clone(), (q.ready, q.scheduled, q.dead)))
        .collect()
}

async fn oldest_ready_age(pool: &deadpool_postgres::Pool, queue: &str) -> f64 {
    let s = sample(pool, DEPTH_CAP_DEFAULT).await.unwrap();
    s.queues
        .iter()
        .find(|q| q.queue == queue)
        .unwrap_or_else(|| panic!("queue {queue} not sampled: {s:?}"))
        .oldest_ready_age
}

async fn admin_client() -> tokio_postgres::Client {
    pgwake::connect::connect(&pgwake::connect::parse_url(admin_url()).unwrap())
        .await
        .unwrap()
}

/// The transaction age of `application`'s session as the server sees it now;
/// waits until it is above 0.
async fn idle_transaction_age(db: &TestDb, application: &str) -> f64 {
    let client = db.client().await;
    wait_for_every(
        &format!("{application} to show as idle in transaction"),
        DEADLINE,
        Duration::from_millis(20),
        async || {
            let age: Option<f64> = client
                .query_opt(
                    "SELECT extract(epoch FROM clock_timestamp() - xact_start)::float8
                     FROM pg_stat_activity
                     WHERE application_name = $1 AND state = 'idle in transaction'",
                    &[&application],
                )
                .await
                .unwrap()
                .map(|r| r.get(0));
            match age {
                Some(age) if age > 0.0 => Ok(age),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
}
