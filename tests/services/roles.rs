//! Least privilege: non-superuser roles with exactly the documented grants
//! (`pgwake.grant_producer`, `grant_worker`, `grant_monitor`) run a
//! producer, a worker (both delivery modes, retries, dead jobs) and the
//! monitoring commands; each is refused what it was not granted.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::{Outcome, Worker};

/// `db`'s URL and settings as `role` (password `pw`; the throwaway cluster's
/// socket trusts it, an external server may ask for it).
fn as_role(db: &TestDb, role: &str) -> (String, pgwake::connect::DbConfig) {
    let mut cfg = db.config();
    cfg.user(role);
    cfg.password("pw");
    let url = db.url.replacen("://postgres", &format!("://{role}:pw"), 1);
    (url, cfg)
}

async fn roles_db() -> TestDb {
    let db = migrated_db().await;
    let c = db.client().await;
    for role in ["rl_producer", "rl_worker", "rl_monitor"] {
        c.batch_execute(&format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{role}') THEN
                     CREATE ROLE {role} LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
                 END IF;
             END $$;
             GRANT CONNECT ON DATABASE {} TO {role};",
            db.name
        ))
        .await
        .unwrap();
    }
    c.batch_execute(
        "SELECT pgwake.grant_producer('rl_producer');
         SELECT pgwake.grant_worker('rl_worker');
         SELECT pgwake.grant_monitor('rl_monitor');",
    )
    .await
    .unwrap();
    db
}

fn denied(e: &tokio_postgres::Error) -> bool {
    e.code().map(|c| c.code()) == Some("42501")
}

#[tokio::test]
async fn a_role_without_grants_is_refused_with_permission_denied() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "DO $$ BEGIN
             IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rl_nobody') THEN
                 CREATE ROLE rl_nobody LOGIN PASSWORD 'pw';
             END IF;
         END $$;",
    )
    .await
    .unwrap();
    let (_, cfg) = as_role(&db, "rl_nobody");
    let nobody = pgwake::connect::connect(&cfg).await.unwrap();
    let e = nobody
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "{e}");
}

#[tokio::test]
async fn producer_worker_and_monitor_roles_work_with_the_documented_grants() {
    let db = roles_db().await;

    // Producer: plain INSERT, pgwake.enqueue(), the CLI; nothing else.
    // Trace contexts (functions/traces.sql) from each, and a malformed one
    // counted, with no grant on their table or counter.
    let (producer_url, producer_cfg) = as_role(&db, "rl_producer");
    let producer = pgwake::connect::connect(&producer_cfg).await.unwrap();
    producer
        .batch_execute(
            "BEGIN;
             SET LOCAL pgwake.traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
             INSERT INTO pgwake.jobs (task) VALUES ('ok');
             COMMIT;
             SELECT pgwake.enqueue('ok', queue => 'long', traceparent => 'malformed');
             SELECT pgwake.enqueue('fail_once');
             SELECT pgwake.enqueue('doomed', max_attempts => 1,
                 traceparent => '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01');
             -- Keyed: the second of each key is held behind the first (the
             -- insert trigger reads and updates what a producer may not).
             SELECT pgwake.enqueue('ok', ordering_key => 'rk');
             INSERT INTO pgwake.jobs (task, ordering_key) VALUES ('ok', 'rk');
             SELECT pgwake.enqueue('ok', queue => 'long', ordering_key => 'lk');
             SELECT pgwake.enqueue('ok', queue => 'long', ordering_key => 'lk');",
        )
        .await
        .unwrap();
    let out = pgwake_cmd()
        .env("DATABASE_URL", &producer_url)
        .args(["enqueue", "--task", "ok"])
        .env(
            "TRACEPARENT",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-b7ad6b7169203331-01",
        )
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let traced: i64 = db.scalar("SELECT count(*) FROM pgwake.job_traces").await;
    let rejected: i64 = db
        .scalar("SELECT last_value FROM pgwake.trace_context_rejected")
        .await;
    assert_eq!((traced, rejected), (3, 1));
    // Signals (functions/signals.sql, SECURITY DEFINER): a producer sends
    // one, kept since no job waits for it.
    producer
        .batch_execute("SELECT pgwake.signal('rl-payment', '{\"paid\": true}')")
        .await
        .unwrap();
    let kept: i64 = db.scalar("SELECT count(*) FROM pgwake.signals").await;
    assert_eq!(kept, 1, "a producer signals");
    let e = producer
        .execute("DELETE FROM pgwake.jobs", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "a producer must not delete jobs: {e}");
    let e = producer
        .query("SELECT payload FROM pgwake.jobs", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "a producer must not read payloads: {e}");

    // Worker: tx mode, lease mode, a retry, a dead job, and keyed jobs (each
    // key's second job released when the first ends).
    let (_, worker_cfg) = as_role(&db, "rl_worker");
    let worker = Worker::builder(worker_cfg)
        .config(pgwake::WorkerConfig {
            lease_queues: vec!["long".into()],
            sample_interval: Some(Duration::from_millis(200)),
            ..test_config()
        })
        .handler("ok", ok_handler(&Ledger::default()))
        .handler(
            "fail_once",
            Recording {
                ledger: Ledger::default(),
                behaviour: |j: &pgwake::Job| {
                    if j.attempt == 1 {
                        Err("first attempt fails".into())
                    } else {
                        Ok(Outcome::Done)
                    }
                },
            },
        )
        .handler(
            "doomed",
            Recording {
                ledger: Ledger::default(),
                behaviour: |_: &pgwake::Job| Err("always fails".into()),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w
        .next_events(9, Duration::from_secs(60), |e| e.outcome() != "retry")
        .await;
    let dead = events.iter().filter(|e| e.outcome() == "dead").count();
    let done = events.iter().filter(|e| e.outcome() == "done").count();
    assert_eq!((done, dead), (8, 1), "{events:?}");
    w.stop.cancel();
    w.join.await.unwrap().unwrap();

    // Monitor: stats and dead list; no writes.
    let (monitor_url, monitor_cfg) = as_role(&db, "rl_monitor");
    let dead_id: i64 = db.scalar("SELECT min(id) FROM pgwake.dead_jobs").await;
    let dead_id = dead_id.to_string();
    for args in [
        vec!["stats", "--json"],
        vec!["dead", "list", "--json"],
        vec!["jobs", "list", "--state", "dead"],
        vec!["explain", &dead_id],
        // the dead job's trace context too
        vec!["job", "show", &dead_id],
    ] {
        let out = pgwake_cmd()
            .env("DATABASE_URL", &monitor_url)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pgwake {args:?} as monitor: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let monitor = pgwake::connect::connect(&monitor_cfg).await.unwrap();
    let e = monitor
        .execute("INSERT INTO pgwake.jobs (task) VALUES ('t')", &[])
        .await
        .unwrap_err();
    assert!(denied(&e), "a monitor must not enqueue: {e}");
}

#[tokio::test]
async fn exec_commands_get_an_explicit_environment_without_the_database_secrets() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("env.txt");
    db.client()
        .await
        .batch_execute("SELECT pgwake.enqueue('dump')")
        .await
        .unwrap();
    let handler = format!("dump=exec:sh -c 'env > {}'", out_file.display());
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .env("PGWAKE_LISTEN_DATABASE_URL", &db.url)
        .env("PGPASSWORD", "hunter2")
        .env("PGWAKE_EXEC_API_TOKEN", "t0ken")
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--handler",
            &handler,
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let log = tail_stderr(&mut child);
    wait_files(dir.path(), "env.txt", 1).await;
    eventually("the job is done", Duration::from_secs(30), || async {
        let n: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
        n == 0
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, Duration::from_secs(30)).await;
    assert!(out.status.success(), "{}", log.lock().unwrap());
    let env = std::fs::read_to_string(&out_file).unwrap();
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    for secret in ["DATABASE_URL", "PGWAKE_LISTEN_DATABASE_URL", "PGPASSWORD"] {
        assert!(!names.contains(&secret), "{secret} leaked: {env}");
    }
    assert!(!env.contains("hunter2"), "{env}");
    for expected in ["PATH", "PGWAKE_JOB_ID", "PGWAKE_TASK", "API_TOKEN"] {
        assert!(names.contains(&expected), "{expected} missing: {env}");
    }
    assert!(env.contains("API_TOKEN=t0ken"), "{env}");
}

/// The demo on a user's database runs its own jobs in its own queues
/// (tests/cli/demo.rs shows real jobs stay untouched); jobs an earlier demo
/// left in those queues make it refuse (exit 2), touching none.
#[tokio::test]
async fn demo_refuses_leftover_demo_jobs_and_touches_none() {
    let db = migrated_db().await;
    let id: i64 = db
        .scalar("SELECT pgwake.enqueue('resize_image', queue => 'pgwake-demo')")
        .await;
    let out = pgwake_cmd()
        .args([
            "demo",
            "--database-url",
            &db.url,
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("an earlier demo"), "{stderr}");
    let still: i64 = db
        .scalar(&format!(
            "SELECT count(*) FROM pgwake.jobs WHERE id = {id} AND attempts = 0"
        ))
        .await;
    assert_eq!(still, 1);
}

/// Issue 33, item 10: `set_queue_limit_key_path` ran as its owner (SECURITY
/// DEFINER) with EXECUTE left to PUBLIC, so any producer could re-key a
/// queue's tenants. A producer now calls only what it was granted, and
/// still inserts and enqueues (keys, unique jobs, limit keys included).
#[tokio::test]
async fn a_producer_cannot_change_queue_settings_or_call_operator_functions() {
    let db = roles_db().await;
    let (_, producer_cfg) = as_role(&db, "rl_producer");
    let producer = pgwake::connect::connect(&producer_cfg).await.unwrap();
    for call in [
        "SELECT pgwake.set_queue_limit_key_path('victim', 'tenant')",
        "SELECT pgwake.set_queue_max_running('victim', 1)",
        "SELECT pgwake.set_queue_rate('victim', 1, '1 hour')",
        "SELECT pgwake.set_queue_rate_per_key('victim', 1, '1 hour')",
        "SELECT pgwake.set_queue_fair_keys('victim', false)",
        "SELECT pgwake.set_queue_max_running_per_key('victim', 1)",
        "SELECT pgwake.set_queue_key_max_running('victim', 'k', 1)",
        "SELECT pgwake.pause_queue('victim')",
        "SELECT pgwake.resume_queue('victim')",
        "SELECT pgwake.cancel(1)",
        "SELECT pgwake.request_cancel(1)",
        "SELECT pgwake.schedule_add('s', '* * * * *', 't')",
        "SELECT pgwake.schedule_remove('s')",
        "SELECT pgwake.rescue(10)",
        "SELECT pgwake.history_partition(current_date)",
        "SELECT pgwake.grant_worker('rl_producer')",
        "SELECT * FROM pgwake.claim_tx_all(1, NULL, NULL, NULL)",
        "SELECT * FROM pgwake.explain(1)",
    ] {
        let e = producer.batch_execute(call).await.unwrap_err();
        let msg = e.as_db_error().map(|d| d.message().to_string());
        assert!(
            denied(&e)
                && msg
                    .as_deref()
                    .is_some_and(|m| m.starts_with("permission denied for function")),
            "a producer ran {call}: {e:?}"
        );
    }
    let queues: i64 = db.scalar("SELECT count(*) FROM pgwake.queues").await;
    assert_eq!(queues, 0, "a producer created or changed queue rows");

    // What a producer does still works, with a queue that has a limit key
    // path (the insert trigger fills the key as the table's owner).
    db.client()
        .await
        .batch_execute("SELECT pgwake.set_queue_limit_key_path('tenants', 'tenant')")
        .await
        .unwrap();
    producer
        .batch_execute(
            "INSERT INTO pgwake.jobs (task) VALUES ('plain');
             INSERT INTO pgwake.jobs (task, queue, payload) VALUES ('t', 'tenants', '{\"tenant\": \"a\"}');
             SELECT pgwake.enqueue('t', queue => 'tenants', payload => '{\"tenant\": \"b\"}');
             SELECT pgwake.enqueue('t', ordering_key => 'ok1');
             SELECT pgwake.enqueue('t', ordering_key => 'ok1');
             SELECT pgwake.enqueue('t', unique_key => 'u1');
             SELECT pgwake.enqueue('t', unique_key => 'u1', unique_running => true);
             SELECT * FROM pgwake.enqueue_unique('t', unique_key => 'u2');
             SELECT pgwake.enqueue('t', limit_key => 'l1');",
        )
        .await
        .unwrap();
    let keys: String = db
        .scalar(
            "SELECT string_agg(limit_key, ',' ORDER BY limit_key) FROM pgwake.jobs WHERE queue = 'tenants'",
        )
        .await;
    assert_eq!(keys, "a,b");
    let jobs: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(jobs, 8, "one unique duplicate folded");
}

/// Issue 33, item 10: no function of the schema is left executable by
/// PUBLIC (every role), and none that runs as its owner keeps the default
/// ACL, after a migrate from scratch and after a migrate that re-created
/// the functions.
#[tokio::test]
async fn no_pgwake_function_is_executable_by_public() {
    let db = migrated_db().await;
    let check = |when: &'static str| {
        let db = &db;
        async move {
            let public: Option<String> = db
                .scalar(
                    "SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1)
                     FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                     WHERE p.pronamespace = 'pgwake'::regnamespace
                       AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'",
                )
                .await;
            assert_eq!(public, None, "executable by PUBLIC {when}");
            let definers: Option<String> = db
                .scalar(
                    "SELECT string_agg(p.oid::regprocedure::text, ', ' ORDER BY 1)
                     FROM pg_proc p
                     WHERE p.pronamespace = 'pgwake'::regnamespace
                       AND p.prosecdef AND p.proacl IS NULL",
                )
                .await;
            assert_eq!(
                definers, None,
                "SECURITY DEFINER with the default ACL {when}"
            );
        }
    };
    check("after the first migrate").await;
    // An upgrade that re-creates every function (new ones get PUBLIC
    // EXECUTE by default).
    db.client()
        .await
        .batch_execute(
            "DROP FUNCTION pgwake.set_queue_limit_key_path(text, text);
             DELETE FROM pgwake.schema_definitions;",
        )
        .await
        .unwrap();
    let mut c = db.client().await;
    pgwake::admin::schema::migrate(&mut c).await.unwrap();
    check("after a migrate that re-created the functions").await;
}

/// Issue 33, item 13: an upgrade that adds a table (and a function) leaves
/// the roles given pgwake's grants with what their kind gets, without
/// running the grants again: migrate re-applies every recorded role's.
#[tokio::test]
async fn grants_survive_an_upgrade_that_adds_a_table_and_a_function() {
    let db = roles_db().await;
    let mut upgrade = pgwake::admin::schema::MIGRATIONS.to_vec();
    upgrade.push(pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_upgrade_notes.sql",
        sql: "CREATE TABLE pgwake.upgrade_notes (id bigserial PRIMARY KEY, note text NOT NULL);
              CREATE FUNCTION pgwake.upgrade_probe() RETURNS integer LANGUAGE sql AS 'SELECT 1';",
    });
    let mut c = db.client().await;
    let report = pgwake::admin::schema::migrate_list(&mut c, &Default::default(), &upgrade)
        .await
        .unwrap();
    assert_eq!(report.applied, vec![9001]);
    let mut grants: Vec<(String, String)> = report
        .grants
        .iter()
        .map(|g| (g.role.clone(), g.kind.clone()))
        .collect();
    grants.sort();
    assert_eq!(
        grants,
        vec![
            ("rl_monitor".into(), "monitor".into()),
            ("rl_producer".into(), "producer".into()),
            ("rl_worker".into(), "worker".into()),
        ]
    );

    let (_, worker_cfg) = as_role(&db, "rl_worker");
    let worker = pgwake::connect::connect(&worker_cfg).await.unwrap();
    worker
        .batch_execute(
            "INSERT INTO pgwake.upgrade_notes (note) VALUES ('after the upgrade');
             SELECT pgwake.upgrade_probe();",
        )
        .await
        .unwrap();
    let (_, monitor_cfg) = as_role(&db, "rl_monitor");
    let monitor = pgwake::connect::connect(&monitor_cfg).await.unwrap();
    monitor
        .batch_execute("SELECT * FROM pgwake.upgrade_notes")
        .await
        .unwrap();
    let e = monitor
        .batch_execute("INSERT INTO pgwake.upgrade_notes (note) VALUES ('no')")
        .await
        .unwrap_err();
    assert!(denied(&e), "a monitor must not write: {e:?}");
    // A new function is not everyone's: the producer was not given it.
    let (_, producer_cfg) = as_role(&db, "rl_producer");
    let producer = pgwake::connect::connect(&producer_cfg).await.unwrap();
    let e = producer
        .batch_execute("SELECT pgwake.upgrade_probe()")
        .await
        .unwrap_err();
    assert!(denied(&e), "a new function is executable by PUBLIC: {e:?}");
    producer
        .batch_execute("SELECT pgwake.enqueue('t')")
        .await
        .unwrap();
    // A payload over 64 KiB: the insert trigger reads the bound
    // (pgwake.producer_limits, migration 0027) as the producer.
    producer
        .batch_execute("SELECT pgwake.enqueue('t', jsonb_build_object('b', repeat('x', 100000)))")
        .await
        .unwrap();

    // Nothing changed: the next migrate grants nothing again.
    let report = pgwake::admin::schema::migrate_list(&mut c, &Default::default(), &upgrade)
        .await
        .unwrap();
    assert!(report.unchanged() && report.grants.is_empty(), "{report:?}");
}

/// Issue 33, items 10 and 13: roles granted by a pgwake that neither
/// recorded them nor revoked PUBLIC's EXECUTE (schema version 25) keep
/// working across the upgrade that does both: the migration recognises
/// them by their table grants, and migrate gives each its functions in the
/// transaction that takes PUBLIC's away.
#[tokio::test]
async fn roles_granted_before_grants_were_recorded_keep_working_after_the_upgrade() {
    let db = roles_db().await;
    // Back to what version 25 left: no record, every function PUBLIC's,
    // the roles with table grants only.
    db.client()
        .await
        .batch_execute(
            "DROP TABLE pgwake.role_grants;
             DROP TRIGGER jobs_bounds ON pgwake.jobs;
             DROP TABLE pgwake.producer_limits;
             DROP FUNCTION pgwake.producer_limits_fit_schedules(), pgwake.check_job_bounds();
             DELETE FROM pgwake.schema_migrations WHERE version >= 26;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA pgwake TO PUBLIC;
             REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA pgwake FROM rl_producer, rl_worker, rl_monitor;",
        )
        .await
        .unwrap();
    let mut c = db.client().await;
    let report = pgwake::admin::schema::migrate(&mut c).await.unwrap();
    assert!(report.applied.contains(&26), "{report:?}");
    assert!(!report.revoked_public.is_empty(), "{report:?}");
    let mut kinds: Vec<String> = report
        .grants
        .iter()
        .map(|g| format!("{} {}", g.role, g.kind))
        .collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "rl_monitor monitor",
            "rl_producer producer",
            "rl_worker worker"
        ]
    );

    let (_, producer_cfg) = as_role(&db, "rl_producer");
    let producer = pgwake::connect::connect(&producer_cfg).await.unwrap();
    producer
        .batch_execute("SELECT pgwake.enqueue('t', unique_key => 'u')")
        .await
        .unwrap();
    let e = producer
        .batch_execute("SELECT pgwake.set_queue_limit_key_path('default', 'tenant')")
        .await
        .unwrap_err();
    assert!(denied(&e), "{e:?}");
    let (_, worker_cfg) = as_role(&db, "rl_worker");
    let worker = pgwake::connect::connect(&worker_cfg).await.unwrap();
    // The claim functions were PUBLIC's before: now the worker's own.
    worker
        .query(
            "SELECT * FROM pgwake.claim_tx_all(10, NULL, NULL, NULL)",
            &[],
        )
        .await
        .unwrap();
    let (_, monitor_cfg) = as_role(&db, "rl_monitor");
    let monitor = pgwake::connect::connect(&monitor_cfg).await.unwrap();
    monitor
        .batch_execute("SELECT * FROM pgwake.explain(1)")
        .await
        .unwrap();
}

/// A migrate that stops halfway (a later migration fails) leaves no
/// function it created executable by PUBLIC: each step revokes it in its
/// own transaction on a schema that already keeps its functions from
/// PUBLIC.
#[tokio::test]
async fn a_migrate_that_stops_halfway_leaves_no_function_to_public() {
    let db = migrated_db().await;
    let mut list = pgwake::admin::schema::MIGRATIONS.to_vec();
    list.push(pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_probe.sql",
        sql: "CREATE FUNCTION pgwake.halfway_probe() RETURNS integer LANGUAGE sql AS 'SELECT 1';",
    });
    list.push(pgwake::admin::schema::Migration {
        version: 9002,
        name: "9002_fails.sql",
        sql: "SELECT 1 / 0;",
    });
    let mut c = db.client().await;
    pgwake::admin::schema::migrate_list(&mut c, &Default::default(), &list)
        .await
        .unwrap_err();
    let version: i32 = db
        .scalar("SELECT max(version) FROM pgwake.schema_migrations")
        .await;
    assert_eq!(version, 9001);
    let public: bool = db
        .scalar("SELECT has_function_privilege('public', 'pgwake.halfway_probe()', 'EXECUTE')")
        .await;
    assert!(!public, "a function of a half-done migrate is PUBLIC's");
}

/// A producer gives jobs parents (pgwake.enqueue's `after`, pgwake.flow,
/// the Rust client) with no grant but the producer's: the edges, the
/// parents' flags and the child's hold are written by SECURITY DEFINER
/// functions (functions/flows.sql). (Without add_parents and flow in
/// grant_producer, each call is refused with permission denied.)
#[tokio::test]
async fn a_producer_enqueues_children_and_flows_with_its_grants() {
    let db = roles_db().await;
    let (_, producer_cfg) = as_role(&db, "rl_producer");
    let producer = pgwake::connect::connect(&producer_cfg).await.unwrap();
    producer
        .batch_execute(
            "DO $$
             DECLARE a bigint := pgwake.enqueue('ok');
             BEGIN
                 PERFORM pgwake.enqueue('ok', after => ARRAY[a], on_parent_failure => 'wait');
             END $$;
             SELECT pgwake.flow('[{\"name\": \"p\", \"task\": \"ok\"},
                                  {\"name\": \"c\", \"task\": \"ok\", \"after\": [\"p\"]}]');",
        )
        .await
        .unwrap();
    let parent = pgwake::client::enqueue(
        &producer,
        &pgwake::client::NewJob::new("ok", serde_json::json!({})),
    )
    .await
    .unwrap();
    pgwake::client::enqueue(
        &producer,
        &pgwake::client::NewJob::new("ok", serde_json::json!({})).after([parent]),
    )
    .await
    .unwrap();
    let held: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE held AND parents_open = 1")
        .await;
    assert_eq!(held, 3);
    let flagged: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE has_children")
        .await;
    assert_eq!(flagged, 3);
}
