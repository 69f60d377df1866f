//! `pgwake doctor`: every finding created for real and detected, a healthy
//! database that exits 0, a role that sees less, and the exit codes.
//! Findings whose cause is the whole server (connections, the NOTIFY
//! queue, slots, prepared transactions, the healthy baseline) run on a
//! private cluster; the others on a database of their own.

use crate::common;

use common::pgbouncer::Bouncer;
use common::*;
use common::{run_pgwake as run, stderr_of as stderr};
use serde_json::Value;

/// `pgwake doctor --json ARGS` against `url`: the exit code and the report.
fn doctor(url: &str, args: &[&str]) -> (i32, Value) {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let o = run(&all, Some(url));
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            stderr(&o)
        )
    });
    (o.status.code().unwrap(), report)
}

/// The finding `id` of a report.
fn finding<'r>(report: &'r Value, id: &str) -> &'r Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no finding {id}: {report:#}"))
}

/// Its details and fixes as one text, for `contains`.
fn text(f: &Value) -> String {
    format!("{} {} {}", f["summary"], f["details"], f["fix"])
}

fn severity(report: &Value, id: &str) -> String {
    finding(report, id)["severity"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A connection string for `db` as `user` (password `pw`, which the
/// throwaway cluster's socket does not ask for).
fn as_user(db: &TestDb, user: &str, pw: &str) -> String {
    let cfg: tokio_postgres::Config = db.url.parse().unwrap();
    let host = match &cfg.get_hosts()[0] {
        tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
        tokio_postgres::config::Host::Tcp(h) => h.clone(),
    };
    format!(
        "host={host} port={} dbname={} user={user} password={pw}",
        cfg.get_ports()[0],
        db.name
    )
}

#[tokio::test]
async fn a_healthy_database_exits_0_with_every_check_ok_and_one_pinned_session_makes_it_fail() {
    let (_cluster, db) = private_cluster_db().await;
    let c = db.client().await;
    c.batch_execute("ALTER DATABASE postgres SET idle_in_transaction_session_timeout = '10min'")
        .await
        .unwrap();
    let (code, report) = doctor(&db.url, &[]);
    let findings = report["findings"].as_array().unwrap();
    let not_ok: Vec<&Value> = findings.iter().filter(|f| f["severity"] != "ok").collect();
    assert!(not_ok.is_empty(), "{not_ok:#?}");
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["severity"], "ok");
    let ids: Vec<&str> = findings.iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(ids, pgwake::admin::doctor::CHECKS);
    let o = run(&["doctor"], Some(&db.url));
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("0 problem(s), 0 warning(s), 16 ok"), "{out}");

    // The same database, one session holding a snapshot: no longer healthy.
    let holder = connect_as(&db, "report-builder").await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    let (code, report) = doctor(&db.url, &["--horizon-warning", "0s"]);
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(severity(&report, "horizon.pinned"), "warning");
}

#[tokio::test]
async fn a_session_holding_a_snapshot_pins_the_horizon_and_is_named_with_its_fix() {
    let db = migrated_db().await;
    let holder = connect_as(&db, "analytics").await;
    let pid: i32 = holder
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    // A statement that writes an escape sequence, as a producer's or an
    // analyst's text could: the terminal report must not pass it on.
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 /* \u{1b}[2J */")
        .await
        .unwrap();
    // At the default thresholds (a minute) a fresh pin is not reported yet.
    let (_, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "horizon.pinned"), "ok", "{report:#}");

    let (code, report) = doctor(
        &db.url,
        &["--horizon-warning", "0s", "--horizon-problem", "1h"],
    );
    let pinned = finding(&report, "horizon.pinned");
    assert_eq!(pinned["severity"], "warning", "{report:#}");
    let t = text(pinned);
    assert!(t.contains(&format!("pid {pid} (analytics")), "{t}");
    assert!(t.contains("idle in transaction"), "{t}");
    assert!(
        t.contains(&format!("SELECT pg_terminate_backend({pid});")),
        "{t}"
    );
    assert!(code >= 1);

    let o = run(
        &[
            "doctor",
            "--horizon-warning",
            "0s",
            "--horizon-problem",
            "0s",
        ],
        Some(&db.url),
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("problem  horizon.pinned"), "{out}");
    assert!(
        !out.contains('\u{1b}'),
        "a raw escape reached the terminal: {out}"
    );
    assert!(out.contains("\\u{1b}[2J"), "{out}");
}

#[tokio::test]
async fn replication_slots_and_prepared_transactions_that_hold_the_horizon_are_found() {
    let (_cluster, db) =
        private_cluster_db_with(&[("wal_level", "logical"), ("max_prepared_transactions", "4")])
            .await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pg_create_logical_replication_slot('forgotten_subscriber', 'pgoutput')",
    )
    .await
    .unwrap();
    c.batch_execute("BEGIN; SELECT pg_current_xact_id(); PREPARE TRANSACTION 'forgotten-2pc'")
        .await
        .unwrap();
    let (code, report) = doctor(&db.url, &["--horizon-warning", "0s"]);
    assert_eq!(code, 2, "{report:#}");
    let slots = finding(&report, "horizon.replication_slot");
    assert_eq!(slots["severity"], "problem");
    let t = text(slots);
    assert!(t.contains("logical slot forgotten_subscriber"), "{t}");
    assert!(t.contains("inactive"), "{t}");
    assert!(t.contains("catalog_xmin"), "{t}");
    assert!(
        t.contains("SELECT pg_drop_replication_slot('forgotten_subscriber');"),
        "{t}"
    );
    let prepared = finding(&report, "horizon.prepared_transaction");
    assert_eq!(prepared["severity"], "warning", "{report:#}");
    assert!(
        text(prepared).contains("ROLLBACK PREPARED 'forgotten-2pc';"),
        "{prepared:#}"
    );
    // The default thresholds: a prepared transaction of a second is news,
    // an inactive slot is a problem at any age.
    let (_, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "horizon.prepared_transaction"), "ok");
    assert_eq!(severity(&report, "horizon.replication_slot"), "problem");
}

#[tokio::test]
async fn an_unset_idle_in_transaction_timeout_is_a_warning_with_the_statement_that_sets_it() {
    let db = migrated_db().await;
    // The test server runs with the default, 0.
    let (_, report) = doctor(&db.url, &[]);
    let f = finding(&report, "timeouts.idle_in_transaction");
    assert_eq!(f["severity"], "warning", "{report:#}");
    let fix = format!(
        "ALTER DATABASE \\\"{}\\\" SET idle_in_transaction_session_timeout",
        db.name
    );
    assert!(text(f).contains(&fix), "{f:#}");
    db.client()
        .await
        .batch_execute(&format!(
            "ALTER DATABASE {} SET idle_in_transaction_session_timeout = '5min'",
            db.name
        ))
        .await
        .unwrap();
    let (_, report) = doctor(&db.url, &[]);
    let f = finding(&report, "timeouts.idle_in_transaction");
    assert_eq!(f["severity"], "ok", "{report:#}");
    assert!(text(f).contains("5min (database level)"), "{f:#}");
}

#[tokio::test]
async fn a_short_statement_timeout_or_an_idle_session_timeout_on_a_pgwake_role_is_found() {
    let db = migrated_db().await;
    let worker = format!("doctor_worker_{}", rand::random::<u32>());
    let c = db.client().await;
    c.batch_execute(&format!(
        "CREATE ROLE {worker} LOGIN;
         SELECT pgwake.grant_worker('{worker}');
         ALTER ROLE {worker} IN DATABASE {db} SET statement_timeout = '2s';
         ALTER ROLE CURRENT_USER IN DATABASE {db} SET idle_session_timeout = '1h';",
        db = db.name
    ))
    .await
    .unwrap();
    let (code, report) = doctor(&db.url, &[]);
    assert_eq!(code, 1, "{report:#}");
    let statement = finding(&report, "timeouts.statement");
    assert_eq!(statement["severity"], "warning", "{report:#}");
    let t = text(statement);
    assert!(
        t.contains(&format!(
            "role {worker}: statement_timeout = 2s (role in database level)"
        )),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "ALTER ROLE \\\"{worker}\\\" IN DATABASE \\\"{}\\\" SET statement_timeout = 0;",
            db.name
        )),
        "{t}"
    );
    let idle = finding(&report, "timeouts.idle_session");
    assert_eq!(idle["severity"], "warning", "{report:#}");
    assert!(text(idle).contains("idle_session_timeout = 1h"), "{idle:#}");
    c.batch_execute(&format!(
        "ALTER ROLE CURRENT_USER IN DATABASE {db} RESET idle_session_timeout;
         DROP OWNED BY {worker}; DROP ROLE {worker};",
        db = db.name
    ))
    .await
    .unwrap();
}

#[tokio::test]
async fn autovacuum_off_and_dead_tuples_on_the_queue_table_are_found() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute("ALTER TABLE pgwake.jobs SET (autovacuum_enabled = off)")
        .await
        .unwrap();
    insert_jobs(&db, "t", 2000).await;
    c.batch_execute("DELETE FROM pgwake.jobs").await.unwrap();
    // Statistics reach shared memory when the backend goes idle, at most
    // once a second unless forced: force it, so the counts are there when
    // this statement returns.
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    let (code, report) = doctor(&db.url, &["--dead-tuples-warning", "1000"]);
    assert_eq!(code, 2, "{report:#}");
    let off = finding(&report, "autovacuum.off");
    assert_eq!(off["severity"], "problem");
    let t = text(off);
    assert!(t.contains("pgwake.jobs: autovacuum_enabled = off"), "{t}");
    assert!(
        t.contains("ALTER TABLE pgwake.\\\"jobs\\\" RESET (autovacuum_enabled);"),
        "{t}"
    );
    let dead = finding(&report, "tables.dead_tuples");
    assert_eq!(dead["severity"], "warning", "{report:#}");
    let t = text(dead);
    assert!(t.contains("pgwake.jobs: 2000 dead"), "{t}");
    assert!(t.contains("autovacuum off"), "{t}");
    assert!(t.contains("VACUUM (VERBOSE) pgwake.\\\"jobs\\\";"), "{t}");
    // Ten times the threshold is a problem; the default (100,000) is not
    // reached.
    let (_, report) = doctor(&db.url, &["--dead-tuples-warning", "200"]);
    assert_eq!(severity(&report, "tables.dead_tuples"), "problem");
    let (_, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "tables.dead_tuples"), "ok");
}

#[tokio::test]
async fn autovacuum_off_for_the_whole_server_is_a_problem_with_the_setting_to_change() {
    let (_cluster, db) = private_cluster_db_with(&[("autovacuum", "off")]).await;
    let (code, report) = doctor(&db.url, &[]);
    assert_eq!(code, 2, "{report:#}");
    let f = finding(&report, "autovacuum.off");
    assert_eq!(f["severity"], "problem");
    let t = text(f);
    assert!(t.contains("the server's autovacuum is off"), "{t}");
    assert!(
        t.contains("ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf();"),
        "{t}"
    );
}

#[tokio::test]
async fn a_vacuum_running_on_the_queue_and_dead_rows_it_could_not_remove_are_reported() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute("INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 100)")
        .await
        .unwrap();
    // A snapshot older than the delete: vacuum may not remove those rows.
    let pinner = connect_as(&db, "pinner").await;
    pinner
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    c.batch_execute("DELETE FROM pgwake.jobs WHERE id % 2 = 0")
        .await
        .unwrap();
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    // A cursor pins a page; VACUUM (FREEZE) waits for it, and is seen running.
    let cursor = db.client().await;
    cursor
        .batch_execute("BEGIN; DECLARE c CURSOR FOR SELECT * FROM pgwake.jobs; FETCH 1 FROM c")
        .await
        .unwrap();
    let vacuum = {
        let v = db.client().await;
        tokio::spawn(async move { v.batch_execute("VACUUM (FREEZE) pgwake.jobs").await })
    };
    wait_for(
        "the doctor to see the vacuum running",
        std::time::Duration::from_secs(30),
        async || {
            let (_, report) = doctor(&db.url, &["--dead-tuples-warning", "10"]);
            let t = text(finding(&report, "tables.dead_tuples"));
            if t.contains("pgwake.jobs: 50 dead") && t.contains("a vacuum runs on it now") {
                Ok(())
            } else {
                Err(t)
            }
        },
    )
    .await;
    cursor.batch_execute("COMMIT").await.unwrap();
    vacuum.await.unwrap().unwrap();
    let (_, report) = doctor(
        &db.url,
        &["--dead-tuples-warning", "10", "--horizon-warning", "0s"],
    );
    let dead = finding(&report, "tables.dead_tuples");
    assert_eq!(dead["severity"], "warning", "{report:#}");
    let t = text(dead);
    // The vacuum ran and left them: the horizon holds them.
    assert!(
        t.contains("pgwake.jobs: 50 dead, ~50 live; last vacuum "),
        "{t}"
    );
    assert!(
        !t.contains("last vacuum never") && !t.contains("runs on it now"),
        "{t}"
    );
    assert!(t.contains("end what holds the vacuum horizon"), "{t}");
    assert!(
        text(finding(&report, "horizon.pinned")).contains("(pinner"),
        "{report:#}"
    );
}

#[tokio::test]
async fn a_queue_index_bloated_by_deleted_jobs_is_found() {
    let db = migrated_db().await;
    let c = db.client().await;
    // Inserted, deleted and vacuumed by one session (its statistics reach
    // the server in order): the rows are gone, the index pages stay.
    c.batch_execute("INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 60000)")
        .await
        .unwrap();
    c.batch_execute("DELETE FROM pgwake.jobs").await.unwrap();
    c.batch_execute("VACUUM pgwake.jobs").await.unwrap();
    c.batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    let (code, report) = doctor(&db.url, &["--index-bloat-min-size", "1"]);
    let bloat = finding(&report, "tables.index_bloat");
    assert_eq!(bloat["severity"], "warning", "{report:#}");
    let t = text(bloat);
    assert!(t.contains("on pgwake.jobs"), "{t}");
    assert!(t.contains("for ~0 live rows"), "{t}");
    assert!(t.contains("REINDEX INDEX CONCURRENTLY pgwake."), "{t}");
    assert!(code >= 1);
    // Below the default size (64 MiB) an index is never reported.
    let (_, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "tables.index_bloat"), "ok");
}

#[tokio::test]
async fn sessions_near_max_connections_are_found_with_who_holds_them() {
    let (_cluster, db) = private_cluster_db_with(&[("max_connections", "20")]).await;
    // 20 less 3 reserved for superusers: 17. The doctor holds 2; 13 more
    // make 15 (88%).
    let mut hogs = Vec::new();
    for _ in 0..13 {
        hogs.push(connect_as(&db, "connection-hog").await);
    }
    let (_, report) = doctor(&db.url, &[]);
    let f = finding(&report, "connections.budget");
    assert_eq!(f["severity"], "warning", "{report:#}");
    let t = text(f);
    assert!(t.contains("15 client session(s) of 17 available"), "{t}");
    assert!(t.contains("max_connections 20 less 3 reserved"), "{t}");
    assert!(t.contains("13 session(s): connection-hog"), "{t}");
    // Two more: 17 of 17.
    hogs.push(connect_as(&db, "connection-hog").await);
    hogs.push(connect_as(&db, "connection-hog").await);
    let (code, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "connections.budget"), "problem");
    assert_eq!(code, 2);
}

#[tokio::test]
async fn a_notify_queue_held_by_a_listener_in_a_transaction_is_found() {
    let (_cluster, db) = private_cluster_db().await;
    let listener = connect_as(&db, "stuck-listener").await;
    listener.batch_execute("LISTEN doctor").await.unwrap();
    // In a transaction a session reads no notification: the queue's tail
    // stays at its position.
    listener.batch_execute("BEGIN; SELECT 1").await.unwrap();
    // 13,000 notifications of ~8 kB, one queue page each: about 1.2% of
    // the 8 GB queue (the warning is at 1%).
    db.client()
        .await
        .batch_execute(
            "SELECT count(pg_notify('doctor', g || repeat('x', 7900))) FROM generate_series(1, 13000) g",
        )
        .await
        .unwrap();
    let (code, report) = doctor(&db.url, &[]);
    let f = finding(&report, "notify.queue");
    assert_eq!(f["severity"], "warning", "{report:#}");
    let t = text(f);
    assert!(t.contains("stuck-listener, idle in transaction"), "{t}");
    assert!(t.contains("SELECT pg_terminate_backend("), "{t}");
    assert!(code >= 1);
}

#[tokio::test]
async fn live_workers_of_another_pgwake_version_are_found() {
    let db = migrated_db().await;
    let c = db.client().await;
    let register = "INSERT INTO pgwake.workers (id, host, pid, version, application_name, tasks,
                                               concurrency, expires_at)
                    VALUES ($1, 'host-a', $2, $3, 'pgwake', '{t}', 4, now() + interval '1 hour')";
    c.execute(register, &[&"current", &1i32, &env!("CARGO_PKG_VERSION")])
        .await
        .unwrap();
    let (_, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "workers.versions"), "ok", "{report:#}");
    c.execute(register, &[&"old", &2i32, &"0.0.1"])
        .await
        .unwrap();
    let (_, report) = doctor(&db.url, &[]);
    let f = finding(&report, "workers.versions");
    assert_eq!(f["severity"], "warning", "{report:#}");
    let t = text(f);
    assert!(
        t.contains("1 of 2 live worker(s) run another pgwake version (0.0.1)"),
        "{t}"
    );
    assert!(t.contains("host-a pid 2 (pgwake): pgwake 0.0.1"), "{t}");
}

#[tokio::test]
async fn jobs_of_a_task_no_live_worker_serves_are_found() {
    let db = migrated_db().await;
    let (_, report) = doctor(&db.url, &[]);
    assert_eq!(severity(&report, "tasks.unserved"), "ok", "{report:#}");
    insert_jobs(&db, "nobody serves me", 3).await;
    let (code, report) = doctor(&db.url, &[]);
    let f = finding(&report, "tasks.unserved");
    assert_eq!(f["severity"], "warning", "{report:#}");
    assert!(
        text(f).contains("queue default task nobody serves me: 3 job(s)"),
        "{f:#}"
    );
    assert!(code >= 1);
}

#[tokio::test]
async fn a_missing_an_older_and_a_newer_schema_are_problems_with_their_fix() {
    let empty = empty_db().await;
    let (code, report) = doctor(&empty.url, &[]);
    assert_eq!(code, 2);
    let f = finding(&report, "schema.version");
    assert_eq!(f["severity"], "problem");
    assert!(text(f).contains("pgwake migrate"), "{f:#}");
    assert!(
        finding(&report, "tasks.unserved")["summary"]
            .as_str()
            .unwrap()
            .starts_with("skipped"),
        "{report:#}"
    );

    let latest = pgwake::admin::schema::latest_version();
    // Three migrations back (numbers may have gaps while branches that own
    // them are unmerged: latest - 3 need not exist).
    let older_version = pgwake::admin::schema::MIGRATIONS
        .iter()
        .rev()
        .nth(3)
        .unwrap()
        .version;
    let older = schema_at(older_version).await;
    let (code, report) = doctor(&older.url, &[]);
    assert_eq!(code, 2);
    let f = finding(&report, "schema.version");
    assert_eq!(f["severity"], "problem");
    let t = text(f);
    assert!(t.contains(&format!("version {older_version}")), "{t}");
    assert!(t.contains("pgwake migrate"), "{t}");

    let newer = migrated_db().await;
    newer
        .client()
        .await
        .execute(
            "INSERT INTO pgwake.schema_migrations (version, name) VALUES ($1, 'from the future')",
            &[&(latest + 1)],
        )
        .await
        .unwrap();
    let (code, report) = doctor(&newer.url, &[]);
    assert_eq!(code, 2);
    let f = finding(&report, "schema.version");
    assert_eq!(f["severity"], "problem");
    assert!(text(f).contains("upgrade pgwake"), "{f:#}");
}

#[tokio::test]
async fn a_role_without_pg_read_all_stats_is_told_what_it_cannot_see_and_never_crashes() {
    let db = migrated_db().await;
    let monitor = format!("doctor_monitor_{}", rand::random::<u32>());
    let c = db.client().await;
    c.batch_execute(&format!(
        "CREATE ROLE {monitor} LOGIN PASSWORD 'pw'; SELECT pgwake.grant_monitor('{monitor}');"
    ))
    .await
    .unwrap();
    // Another role's session pinning the horizon: hidden from the monitor.
    let holder = connect_as(&db, "hidden-analytics").await;
    holder
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .await
        .unwrap();
    let (code, report) = doctor(&as_user(&db, &monitor, "pw"), &["--horizon-warning", "0s"]);
    assert_eq!(report["role"], monitor.as_str(), "{report:#}");
    let f = finding(&report, "stats.visibility");
    assert_eq!(f["severity"], "warning", "{report:#}");
    let t = text(f);
    assert!(t.contains("cannot see other roles' sessions"), "{t}");
    assert!(
        t.contains(&format!("GRANT pg_monitor TO \\\"{monitor}\\\"")),
        "{t}"
    );
    // What it can see it checks; nothing fails.
    assert_eq!(severity(&report, "horizon.pinned"), "ok", "{report:#}");
    let failed: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["summary"]
                .as_str()
                .unwrap()
                .starts_with("could not check")
        })
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
    assert_eq!(code, 1, "{report:#}");
    drop(holder);
    c.batch_execute(&format!("DROP OWNED BY {monitor}; DROP ROLE {monitor};"))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_transaction_mode_pooler_is_recognised() {
    let (cluster, _db) = private_cluster_db().await;
    let bouncer = Bouncer::start(&cluster, 5).await;
    let (_, report) = doctor(&bouncer.url("app_tx"), &[]);
    let f = finding(&report, "pooler.mode");
    assert_eq!(f["severity"], "ok");
    assert!(
        text(f).contains("goes through a transaction-mode pooler"),
        "{report:#}"
    );
    // Every other check still ran through it.
    assert_eq!(severity(&report, "schema.version"), "ok", "{report:#}");
    let (_, report) = doctor(&bouncer.url("app_session"), &[]);
    assert!(
        text(finding(&report, "pooler.mode")).contains("no transaction-mode pooler seen"),
        "{report:#}"
    );
}

#[test]
fn when_no_check_can_run_doctor_exits_3_never_a_severity() {
    let o = run(
        &["doctor"],
        Some("postgres://app:s3cretpw@127.0.0.1:1/app?connect_timeout=2"),
    );
    assert_eq!(o.status.code(), Some(3));
    let e = stderr(&o);
    assert!(e.contains("check the host and port (DATABASE_URL)"), "{e}");
    assert!(e.contains("no check ran"), "{e}");
    assert!(!e.contains("s3cretpw"), "{e}");
    assert!(o.stdout.is_empty());

    let url = Some("postgres://u@127.0.0.1:1/x");
    let o = run(&["doctor", "--dead-tuples-warning", "0"], url);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--dead-tuples-warning"),
        "{}",
        stderr(&o)
    );
    let o = run(&["doctor", "--no-such-flag"], url);
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    let o = run(
        &[
            "doctor",
            "--horizon-warning",
            "10m",
            "--horizon-problem",
            "1m",
        ],
        url,
    );
    assert_eq!(o.status.code(), Some(3), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--horizon-problem (1m) must be at least --horizon-warning (10m)"),
        "{}",
        stderr(&o)
    );
    // Other commands keep their codes.
    let o = run(&["stats", "--no-such-flag"], url);
    assert_eq!(o.status.code(), Some(2));
}
