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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pgwake::sampler::{sample, Sample, DEPTH_CAP_DEFAULT};
use pgwake::{BoxError, Job, Outcome, Worker, WorkerConfig};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(120);

/// Prometheus scrapes (and evaluates rules) this often.
const SCRAPE_INTERVAL: &str = "1s";

/// What the dashboard's range macros (`$__rate_interval`, `$__range`,
/// `$__interval`) become: at a 1 s scrape interval it holds the two samples
/// `rate()` needs a few seconds after the first scrape.
const RANGE: &str = "1m";

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
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let dead = sample(&pool, DEPTH_CAP_DEFAULT).await.unwrap().dead_tuples;
        if dead >= before + 500 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "dead tuples of pgwake.jobs stayed at {dead} (before: {before})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

// ---------------------------------------------------------------- the load

/// The queues of the load; `leases` runs in lease mode.
const QUEUES: [&str; 3] = ["emails", "reports", "leases"];

/// A worker under steady load (successes, retries, dead jobs, a rescued
/// lease, a scheduled job per queue, a session idle in transaction), with its
/// endpoint served.
struct Load {
    endpoint: SocketAddr,
    ledger: Ledger,
    running: Running,
    producer: tokio::task::JoinHandle<Vec<(i64, String)>>,
    producing: CancellationToken,
    rescued: i64,
    _idle: tokio_postgres::Client,
    _http: tokio::task::JoinHandle<()>,
    http_stop: CancellationToken,
}

impl Load {
    async fn start(db: &TestDb) -> Load {
        let ledger = Ledger::default();
        let worker = Worker::builder(db.config())
            .config(WorkerConfig {
                application_name: "obs-load".into(),
                lease_queues: vec!["leases".into()],
                rescue_interval: Duration::from_millis(200),
                sample_interval: Some(Duration::from_millis(250)),
                ..test_config()
            })
            .handler("send", ok_handler(&ledger))
            .handler(
                "flaky",
                Recording {
                    ledger: ledger.clone(),
                    behaviour: |_: &Job| -> Result<Outcome, BoxError> {
                        Err("the flaky task always fails".into())
                    },
                },
            )
            .build()
            .unwrap();
        let http_stop = CancellationToken::new();
        let (endpoint, http) = pgwake::endpoint::serve(
            "127.0.0.1:0",
            pgwake::metrics::install(),
            worker.health(),
            http_stop.clone(),
        )
        .await
        .unwrap();
        let running = Running::start(worker);
        running.until_listening().await;

        let client = db.client().await;
        // One job per queue waits for tomorrow: the `scheduled` state.
        client
            .execute(
                "INSERT INTO pgwake.jobs (queue, task, run_at)
                 SELECT q, 'send', now() + interval '1 day' FROM unnest($1::text[]) q",
                &[&QUEUES.to_vec()],
            )
            .await
            .unwrap();
        // A worker died holding a lease: the rescuer puts its job back.
        let rescued: i64 = client
            .query_one(
                "INSERT INTO pgwake.leased_jobs
                     (id, queue, task, payload, priority, run_at, attempts, max_attempts,
                      created_at, worker_id, lease_until)
                 VALUES (nextval(pg_get_serial_sequence('pgwake.jobs', 'id')), 'leases', 'send',
                         '{}', 0, now(), 1, 5, now(), 'a-worker-that-died', now() - interval '1 minute')
                 RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        // Another application keeps a transaction open.
        let idle = connect_as(db, "obs-report-tool").await;
        idle.batch_execute("BEGIN; SELECT txid_current();")
            .await
            .unwrap();

        let producing = CancellationToken::new();
        let producer = tokio::spawn(produce(db.client().await, producing.clone()));
        Load {
            endpoint,
            ledger,
            running,
            producer,
            producing,
            rescued,
            _idle: idle,
            _http: http,
            http_stop,
        }
    }

    /// Stop producing, let the worker drain, stop it, and check the ledger:
    /// every `send` job ran exactly once, every `flaky` job twice and then
    /// went dead.
    async fn finish(self, db: &TestDb) {
        self.producing.cancel();
        let produced = self.producer.await.unwrap();
        eventually("the worker drains the queues", DEADLINE, || async {
            db.scalar::<i64>(
                "SELECT (SELECT count(*) FROM pgwake.jobs WHERE run_at < now() + interval '1 hour')
                      + (SELECT count(*) FROM pgwake.leased_jobs)",
            )
            .await
                == 0
        })
        .await;
        self.running.shutdown().await;
        self.http_stop.cancel();

        let send: Vec<i64> = produced
            .iter()
            .filter(|(_, task)| task == "send")
            .map(|(id, _)| *id)
            .chain([self.rescued])
            .collect();
        let flaky: Vec<i64> = produced
            .iter()
            .filter(|(_, task)| task == "flaky")
            .map(|(id, _)| *id)
            .collect();
        let dupes = self.ledger.check(&send);
        let send_set: BTreeSet<i64> = send.iter().copied().collect();
        let twice: Vec<_> = dupes
            .iter()
            .filter(|(id, _)| send_set.contains(id))
            .collect();
        assert!(twice.is_empty(), "send jobs that ran twice: {twice:?}");
        let counts = self.ledger.counts();
        let odd: Vec<_> = flaky
            .iter()
            .filter(|id| counts.get(id) != Some(&2))
            .collect();
        assert!(odd.is_empty(), "flaky jobs not run exactly twice: {odd:?}");
        let dead: i64 = db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM pgwake.dead_jobs WHERE id = ANY($1) AND attempts = 2",
                &[&flaky],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(dead as usize, flaky.len(), "every flaky job is dead");
        println!(
            "load: {} send jobs, {} flaky jobs, 1 rescued lease",
            send.len() - 1,
            flaky.len()
        );
    }
}

/// Enqueue, every 100 ms until `stop`, a `send` and a `flaky` job (at most
/// 2 attempts) on every queue; returns what it enqueued.
async fn produce(client: tokio_postgres::Client, stop: CancellationToken) -> Vec<(i64, String)> {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut produced = Vec::new();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return produced,
            _ = tick.tick() => {}
        }
        let rows = client
            .query(
                "INSERT INTO pgwake.jobs (queue, task, max_attempts)
                 SELECT q, t, 2 FROM unnest($1::text[]) q, unnest(ARRAY['send', 'flaky']) t
                 RETURNING id, task",
                &[&QUEUES.to_vec()],
            )
            .await
            .unwrap();
        produced.extend(rows.iter().map(|r| (r.get(0), r.get(1))));
    }
}

/// Poll `/metrics` until it exports every name in `wanted`; returns that
/// exposition.
async fn until_exported(endpoint: SocketAddr, wanted: &BTreeSet<String>) -> String {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let (status, text) = http_get(endpoint, "/metrics").await.unwrap();
        assert_eq!(status, 200, "{text}");
        let exported = exported_names(&text);
        let missing: Vec<_> = wanted.difference(&exported).collect();
        if missing.is_empty() {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard names metrics the worker does not export: {missing:?}\n--- exposition ---\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sample names of a text exposition: the first word of each sample line.
fn exported_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Run `promtool check metrics` on `text`: (exit status ok, findings).
fn promtool_check_metrics(text: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), findings.trim().to_string())
}

// ---------------------------------------------------------------- the dashboard

/// The expressions of `grafana/pgwake-dashboard.json`.
struct Dashboard {
    /// (panel title, expression) of every panel target and annotation.
    targets: Vec<(String, String)>,
    /// (name, query) of every templating variable.
    variables: Vec<(String, String)>,
    /// What each variable stands for when "All" is selected.
    all_values: BTreeMap<String, String>,
}

impl Dashboard {
    fn load() -> Dashboard {
        let path = grafana_dir().join("pgwake-dashboard.json");
        let json: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut targets = Vec::new();
        collect_exprs(&json, "dashboard", &mut targets);
        assert!(!targets.is_empty(), "no expressions in {}", path.display());
        let mut variables = Vec::new();
        let mut all_values = BTreeMap::new();
        for v in json["templating"]["list"].as_array().into_iter().flatten() {
            let name = v["name"].as_str().expect("variable name").to_string();
            match v["type"].as_str() {
                Some("query") => {
                    let query = match &v["query"] {
                        Value::String(q) => q.clone(),
                        q => q["query"].as_str().expect("variable query").to_string(),
                    };
                    let all = v["allValue"].as_str().unwrap_or(".*").to_string();
                    all_values.insert(name.clone(), all);
                    variables.push((name, query));
                }
                Some("datasource") => {}
                other => panic!("variable {name}: type {other:?} is not handled by this test"),
            }
        }
        Dashboard {
            targets,
            variables,
            all_values,
        }
    }

    /// Every expression to query: panel targets with the macros expanded,
    /// and what each variable's query reads.
    fn queries(&self) -> Vec<(String, Query)> {
        let mut out: Vec<(String, Query)> = self
            .targets
            .iter()
            .map(|(title, expr)| (title.clone(), Query::Expr(self.expand(expr))))
            .collect();
        for (name, query) in &self.variables {
            out.push((format!("variable ${name}"), Query::variable(query)));
        }
        out
    }

    /// Metric names the dashboard reads.
    fn metric_names(&self) -> BTreeSet<String> {
        self.queries()
            .iter()
            .flat_map(|(_, q)| match q {
                Query::Expr(e) => metric_names(e),
                Query::LabelOf { metric, .. } => metric_names(metric),
                Query::LabelValues(_) => BTreeSet::new(),
            })
            .collect()
    }

    /// Replace Grafana's macros: range macros by [`RANGE`], variables by
    /// their "All" value. Anything else left over fails the test.
    fn expand(&self, expr: &str) -> String {
        let mut out = String::new();
        let mut rest = expr;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, len) = if let Some(braced) = after.strip_prefix('{') {
                let end = braced.find('}').expect("unterminated ${");
                (braced[..end].split(':').next().unwrap(), end + 2)
            } else {
                let end = after
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(after.len());
                (&after[..end], end)
            };
            let value = match name {
                "__rate_interval" | "__interval" | "__range" => RANGE.to_string(),
                _ => self
                    .all_values
                    .get(name)
                    .unwrap_or_else(|| panic!("unknown macro ${name} in {expr}"))
                    .clone(),
            };
            out.push_str(&value);
            rest = &after[len..];
        }
        out.push_str(rest);
        out
    }
}

/// Every `expr` under `v`, with the title of the panel it belongs to.
fn collect_exprs(v: &Value, title: &str, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            let title = map.get("title").and_then(Value::as_str).unwrap_or(title);
            if let Some(Value::String(expr)) = map.get("expr") {
                out.push((title.to_string(), expr.clone()));
            }
            for (key, child) in map {
                if key != "templating" {
                    collect_exprs(child, title, out);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|i| collect_exprs(i, title, out)),
        _ => {}
    }
}

/// One query against Prometheus.
enum Query {
    /// An instant query.
    Expr(String),
    /// `label_values(metric, label)`: the metric's series carry the label.
    LabelOf { metric: String, label: String },
    /// `label_values(label)`: the label has values.
    LabelValues(String),
}

impl Query {
    fn variable(query: &str) -> Query {
        let q = query.trim();
        if let Some(args) = q
            .strip_prefix("label_values(")
            .and_then(|a| a.strip_suffix(')'))
        {
            return match args.rsplit_once(',') {
                Some((metric, label)) => Query::LabelOf {
                    metric: metric.trim().to_string(),
                    label: label.trim().to_string(),
                },
                None => Query::LabelValues(args.trim().to_string()),
            };
        }
        if let Some(expr) = q
            .strip_prefix("query_result(")
            .and_then(|a| a.strip_suffix(')'))
        {
            return Query::Expr(expr.to_string());
        }
        panic!("variable query {query:?} is not handled by this test");
    }
}

/// The metric names an expression selects: identifiers that are not
/// functions, keywords, label names, strings, numbers or durations.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    const KEYWORDS: &[&str] = &[
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "inf",
        "nan", // operators, literals
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count", // aggregations
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    let s: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut grouping = false;
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i);
        } else if c == '{' || c == '[' || (c == '(' && grouping) {
            i = skip_group(&s, i);
            grouping = false;
        } else if c.is_ascii_digit() || c == '.' {
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '_' || s[i] == ':') {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let next = s[i..].iter().find(|c| !c.is_whitespace());
            let lower = word.to_ascii_lowercase();
            if GROUPING.contains(&lower.as_str()) {
                // Its label list follows, if any: `on() …`, `group_left …`.
                grouping = next == Some(&'(');
            } else if !KEYWORDS.contains(&lower.as_str()) && next != Some(&'(') {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The index after the string literal starting at `i`.
fn skip_string(s: &[char], i: usize) -> usize {
    let quote = s[i];
    let mut j = i + 1;
    while j < s.len() && s[j] != quote {
        j += if s[j] == '\\' && quote != '`' { 2 } else { 1 };
    }
    j + 1
}

/// The index after the bracketed group (`{…}`, `[…]`, `(…)`) starting at `i`.
fn skip_group(s: &[char], i: usize) -> usize {
    let close = match s[i] {
        '{' => '}',
        '[' => ']',
        _ => ')',
    };
    let mut j = i + 1;
    while j < s.len() && s[j] != close {
        j = if matches!(s[j], '"' | '\'' | '`') {
            skip_string(s, j)
        } else {
            j + 1
        };
    }
    j + 1
}

// ---------------------------------------------------------------- Prometheus

/// A Prometheus server started for one test; killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Start Prometheus on a free loopback port, scraping `target` every
    /// [`SCRAPE_INTERVAL`] and loading `rule_files`; wait until it is ready.
    async fn start(target: SocketAddr, rule_files: &[PathBuf]) -> Prometheus {
        let binary = tool("prometheus");
        let rules: String = rule_files
            .iter()
            .map(|p| format!("  - {:?}\n", p.display().to_string()))
            .collect();
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL}\n  scrape_timeout: {SCRAPE_INTERVAL}\n  \
             evaluation_interval: {SCRAPE_INTERVAL}\n\
             rule_files:\n{rules}\
             scrape_configs:\n  - job_name: pgwake\n    static_configs:\n      \
             - targets: [\"{target}\"]\n"
        );
        // The port is free when picked; another process may take it before
        // Prometheus binds it, so a failed start tries another.
        for _ in 0..3 {
            let dir = tempfile::tempdir().unwrap();
            let config_file = dir.path().join("prometheus.yml");
            std::fs::write(&config_file, &config).unwrap();
            let addr = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .unwrap();
            let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
            let child = Command::new(&binary)
                .arg(format!("--config.file={}", config_file.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.path().join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
            let mut prometheus = Prometheus { child, addr, dir };
            if prometheus.until_ready().await {
                return prometheus;
            }
        }
        panic!("Prometheus did not start (three ports tried)");
    }

    /// Wait for `/-/ready`; false if the process exited first.
    async fn until_ready(&mut self) -> bool {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                eprintln!("prometheus exited ({status}):\n{}", self.log());
                return false;
            }
            if let Ok((200, _)) = http_get(self.addr, "/-/ready").await {
                return true;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Prometheus not ready within {DEADLINE:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET /api/v1/<path>`: the `data` of a successful answer.
    async fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(self.addr, &format!("/api/v1/{path}"))
            .await
            .unwrap();
        let json: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET /api/v1/{path}: {status} {e}: {body}"));
        assert_eq!(json["status"], "success", "GET /api/v1/{path}: {body}");
        json["data"].clone()
    }

    /// An instant query's result: vector samples as (labels, value).
    async fn query(&self, expr: &str) -> Vec<(Value, String)> {
        let data = self
            .api(&format!("query?query={}", percent_encode(expr)))
            .await;
        let value = |v: &Value| v[1].as_str().unwrap_or_default().to_string();
        match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| (s["metric"].clone(), value(&s["value"])))
                .collect(),
            Some("scalar") => vec![(Value::Null, value(&data["result"]))],
            other => panic!("{expr}: unexpected result type {other:?}"),
        }
    }

    /// Wait until Prometheus scrapes the worker successfully.
    async fn until_up(&self) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let up = self.query(r#"up{job="pgwake"}"#).await;
            if up.iter().any(|(_, v)| v == "1") {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                let targets = self.api("targets").await;
                panic!(
                    "Prometheus never scraped the worker: {up:?}\n{targets}\n{}",
                    self.log()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Query every dashboard expression until each returns a non-empty
    /// result without NaN; returns how many were checked.
    async fn until_dashboard_has_data(&self, dashboard: &Dashboard) -> usize {
        let queries = dashboard.queries();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let mut failures = Vec::new();
            for (title, query) in &queries {
                if let Err(why) = self.check(query).await {
                    failures.push(format!("{title}: {why}"));
                }
            }
            if failures.is_empty() {
                return queries.len();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {} dashboard expressions have no data:\n{}",
                failures.len(),
                queries.len(),
                failures.join("\n")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn check(&self, query: &Query) -> Result<(), String> {
        match query {
            Query::Expr(expr) => {
                let result = self.query(expr).await;
                if result.is_empty() {
                    return Err(format!("{expr} -> empty"));
                }
                if result.iter().any(|(_, v)| v.eq_ignore_ascii_case("nan")) {
                    return Err(format!("{expr} -> NaN in {result:?}"));
                }
            }
            Query::LabelOf { metric, label } => {
                let result = self.query(metric).await;
                if result.is_empty() || result.iter().any(|(m, _)| m[label.as_str()].is_null()) {
                    return Err(format!(
                        "{metric} has no series with label {label}: {result:?}"
                    ));
                }
            }
            Query::LabelValues(label) => {
                let values = self.api(&format!("label/{label}/values")).await;
                if values.as_array().is_none_or(|v| v.is_empty()) {
                    return Err(format!("label {label} has no values"));
                }
            }
        }
        Ok(())
    }

    /// Wait until every alert rule has been evaluated, and check that none
    /// failed.
    async fn until_rules_evaluate_cleanly(&self) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let groups = self.api("rules").await;
            let rules: Vec<&Value> = groups["groups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["rules"].as_array().into_iter().flatten())
                .collect();
            assert!(!rules.is_empty(), "no rules loaded: {groups}");
            let failed: Vec<_> = rules.iter().filter(|r| r["health"] == "err").collect();
            assert!(
                failed.is_empty(),
                "alert rules fail to evaluate: {failed:?}"
            );
            if rules.iter().all(|r| r["health"] == "ok") {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "alert rules never evaluated: {groups}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Percent-encode a query parameter (RFC 3986 unreserved characters stay).
fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------- helpers

/// An installed tool, or a failure that says how to install it.
fn tool(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not installed: these tests need Prometheus and promtool \
                 (Debian/Ubuntu: `apt-get install prometheus`; .ci/run installs them)"
            )
        })
}

fn grafana_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("grafana")
}

/// A plain HTTP/1.0 GET, so the body runs to the end of the connection
/// (no chunked encoding): (status, body).
async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "HTTP GET timed out"))??;
    let text = String::from_utf8_lossy(&raw);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, text.to_string());
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}

/// A worker's HTTP endpoint on a free loopback port.
struct Endpoint {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl Endpoint {
    async fn serve(worker: &Worker) -> Endpoint {
        let stop = CancellationToken::new();
        let (addr, _task) = pgwake::endpoint::serve(
            "127.0.0.1:0",
            pgwake::metrics::install(),
            worker.health(),
            stop.clone(),
        )
        .await
        .unwrap();
        Endpoint { addr, stop }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.addr, path).await.unwrap()
    }

    /// Poll `/ready` until it answers `status`; returns the answer.
    async fn until_ready(&self, status: u16, what: &str) -> (u16, String) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        loop {
            let answer = self.get("/ready").await;
            if answer.0 == status {
                return answer;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "/ready never answered {status} ({what}); last: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A small pool for calling the sampler directly.
fn sampler_pool(db: &TestDb) -> deadpool_postgres::Pool {
    pgwake::connect::pool(&db.config(), 2).unwrap()
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

/// A connection to `db` with `application_name` set.
async fn connect_as(db: &TestDb, application_name: &str) -> tokio_postgres::Client {
    let config = pgwake::connect::with_application_name(&db.config(), application_name);
    pgwake::connect::connect(&config).await.unwrap()
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
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
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
            Some(age) if age > 0.0 => return age,
            _ => assert!(
                tokio::time::Instant::now() < deadline,
                "{application} never showed as idle in transaction"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
