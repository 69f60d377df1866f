//! Migrations, the schema's constraints, and the SQL producer API.

use crate::common;

use common::*;

#[tokio::test]
async fn concurrent_migrate_leaves_one_correct_schema() {
    let db = empty_db().await;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&url).unwrap())
                .await
                .unwrap();
            pgwake::admin::schema::migrate(&mut c).await.unwrap()
        }));
    }
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(t.await.unwrap().applied);
    }
    applied.sort();
    let all: Vec<i32> = pgwake::admin::schema::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .collect();
    assert_eq!(
        applied, all,
        "each migration applied by exactly one process"
    );
    let versions: i64 = db
        .scalar("SELECT count(*) FROM pgwake.schema_migrations")
        .await;
    assert_eq!(versions, all.len() as i64);
    let triggers: String = db
        .scalar("SELECT string_agg(tgname, ',' ORDER BY tgname) FROM pg_trigger WHERE tgrelid = 'pgwake.jobs'::regclass AND NOT tgisinternal")
        .await;
    assert_eq!(
        triggers,
        // jobs_add_key_slots: per-key limits (migration 0020); the
        // limit-key-path trigger exists only once a queue has a path.
        "jobs_add_key_slots,jobs_hold_ordering_key,jobs_hold_unique_key,jobs_notify,jobs_record_error,\
         jobs_release_ordering_key",
        "each trigger once"
    );
}

#[tokio::test]
async fn migrate_twice_is_a_no_op() {
    let db = migrated_db().await;
    let mut c = db.client().await;
    let report = pgwake::admin::schema::migrate(&mut c).await.unwrap();
    assert!(report.unchanged(), "{report:?}");
    assert_eq!(report.version, pgwake::admin::schema::latest_version());
}

#[tokio::test]
async fn with_fail_fast_a_worker_refuses_a_missing_schema_with_a_hint() {
    let db = empty_db().await;
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            fail_fast: true,
            ..test_config()
        })
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let err = worker
        .run(Default::default(), Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("pgwake migrate"), "{err}");
}

#[tokio::test]
async fn worker_refuses_a_newer_schema() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "INSERT INTO pgwake.schema_migrations (version, name) VALUES (999, 'future.sql')",
        )
        .await
        .unwrap();
    let worker = pgwake::Worker::builder(db.config())
        .config(test_config())
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    let err = worker
        .run(Default::default(), Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("newer than this pgwake knows"), "{err}");
    let mut c = db.client().await;
    let err = pgwake::admin::schema::migrate(&mut c)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("upgrade pgwake"), "{err}");
}

#[tokio::test]
async fn check_constraints_reject_bad_rows() {
    let db = migrated_db().await;
    let c = db.client().await;
    for (sql, constraint) in [
        (
            "INSERT INTO pgwake.jobs (task) VALUES ('')",
            "jobs_task_valid",
        ),
        (
            "INSERT INTO pgwake.jobs (task, max_attempts) VALUES ('t', 0)",
            "jobs_max_attempts_valid",
        ),
        (
            "INSERT INTO pgwake.jobs (task, queue) VALUES ('t', '')",
            "jobs_queue_valid",
        ),
        (
            "INSERT INTO pgwake.jobs (task, attempts) VALUES ('t', -1)",
            "jobs_attempts_valid",
        ),
    ] {
        let err = c.batch_execute(sql).await.unwrap_err();
        let msg = err.as_db_error().unwrap().message().to_string();
        assert!(msg.contains(constraint), "{sql}: {msg}");
    }
    let err = c
        .batch_execute("INSERT INTO pgwake.jobs (payload) VALUES ('{}')")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23502", "task is NOT NULL");
}

#[tokio::test]
async fn plain_insert_and_enqueue_function_take_defaults() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute("INSERT INTO pgwake.jobs (task, payload) VALUES ('plain', '{\"a\":1}')")
        .await
        .unwrap();
    let id: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('fn', '[1,2]', 'mail', now() + interval '1 minute', 5, 3)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let row = c
        .query_one("SELECT queue, priority, attempts, max_attempts, run_at > now() FROM pgwake.jobs WHERE id = $1", &[&id])
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "mail");
    assert_eq!(row.get::<_, i32>(1), 5);
    assert_eq!(row.get::<_, i32>(2), 0);
    assert_eq!(row.get::<_, i32>(3), 3);
    assert!(row.get::<_, bool>(4));
    let row = c
        .query_one(
            "SELECT queue, priority, max_attempts, payload FROM pgwake.jobs WHERE task = 'plain'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "default");
    assert_eq!(row.get::<_, i32>(1), 0);
    assert_eq!(row.get::<_, i32>(2), 25);
    assert_eq!(
        row.get::<_, serde_json::Value>(3),
        serde_json::json!({"a": 1})
    );
    let only_task: i64 = c
        .query_one("SELECT pgwake.enqueue('t')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(only_task > id);
}

#[tokio::test]
async fn the_queue_table_carries_aggressive_autovacuum_settings() {
    let db = migrated_db().await;
    let opts: Vec<String> = db
        .scalar("SELECT reloptions FROM pg_class WHERE oid = 'pgwake.jobs'::regclass")
        .await;
    assert!(
        opts.contains(&"autovacuum_vacuum_scale_factor=0".to_string()),
        "{opts:?}"
    );
    assert!(
        opts.contains(&"autovacuum_vacuum_cost_delay=0".to_string()),
        "{opts:?}"
    );
}

/// A claim in progress: a transaction that deleted a job and stays open,
/// holding ROW EXCLUSIVE on `pgwake.jobs` like a running `tx`-mode claim.
async fn open_claim(db: &TestDb) -> tokio_postgres::Client {
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (task) VALUES ('held');
         BEGIN;
         DELETE FROM pgwake.jobs WHERE task = 'held';",
    )
    .await
    .unwrap();
    c
}

async fn producer_inserts(db: &TestDb) {
    let c = db.client().await;
    tokio::time::timeout(
        std::time::Duration::from_secs(60),
        c.execute("INSERT INTO pgwake.jobs (task) VALUES ('p')", &[]),
    )
    .await
    .expect("a producer's INSERT was blocked behind migrate")
    .unwrap();
}

#[tokio::test]
async fn migrate_on_a_current_schema_changes_nothing_and_never_waits_for_a_running_claim() {
    let db = migrated_db().await;
    let trigger_before: (u32, String) = {
        let c = db.client().await;
        let r = c
            .query_one(
                "SELECT oid, xmin::text FROM pg_trigger WHERE tgname = 'jobs_notify'",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    let claim = open_claim(&db).await;
    let mut c = db.client().await;
    let report = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        pgwake::admin::schema::migrate(&mut c),
    )
    .await
    .expect("migrate waited behind a running claim")
    .unwrap();
    assert!(report.unchanged(), "{report:?}");
    producer_inserts(&db).await;
    let r = c
        .query_one(
            "SELECT oid, xmin::text FROM pg_trigger WHERE tgname = 'jobs_notify'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((r.get::<_, u32>(0), r.get::<_, String>(1)), trigger_before);
    claim.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn migrate_that_must_lock_the_table_steps_aside_for_producers_and_finishes_after_the_claim() {
    let db = migrated_db().await;
    // An upgrade whose definition changed: the trigger must be created again.
    db.client()
        .await
        .batch_execute(
            "DROP TRIGGER jobs_notify ON pgwake.jobs;
             DELETE FROM pgwake.schema_definitions WHERE name = 'notify.sql';",
        )
        .await
        .unwrap();
    let claim = open_claim(&db).await;
    let mut cfg = db.config();
    cfg.application_name("pgwake-migrate-test");
    let migrating = tokio::spawn(async move {
        let mut c = pgwake::connect::connect(&cfg).await.unwrap();
        let opts = pgwake::admin::schema::MigrateOptions {
            lock_timeout: std::time::Duration::from_millis(200),
            lock_retries: 10_000,
        };
        pgwake::admin::schema::migrate_with(&mut c, &opts).await
    });
    // Migrate is in the lock queue (or between tries) …
    eventually(
        "migrate waiting for its lock",
        std::time::Duration::from_secs(30),
        || async {
            let n: i64 = db
                .scalar(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = 'pgwake-migrate-test' AND wait_event_type = 'Lock'",
                )
                .await;
            n > 0
        },
    )
    .await;
    // … and producers still get through while the claim runs.
    producer_inserts(&db).await;
    producer_inserts(&db).await;
    assert!(
        !migrating.is_finished(),
        "migrate cannot finish while the claim holds the table"
    );
    claim.batch_execute("COMMIT").await.unwrap();
    let report = migrating.await.unwrap().unwrap();
    assert_eq!(report.definitions, vec!["notify.sql"]);
    let triggers: i64 = db
        .scalar("SELECT count(*) FROM pg_trigger WHERE tgname = 'jobs_notify'")
        .await;
    assert_eq!(triggers, 1);
}

/// A starting worker waits while `pgwake migrate` holds its lock, even on a
/// schema already at this binary's version (the migrate may still be
/// re-applying `functions/`), and not once the lock is free.
#[tokio::test]
async fn a_running_migrate_keeps_the_schema_pending_even_at_the_current_version() {
    use pgwake::admin::schema::{latest_version, pending, Pending, MIGRATE_LOCK_KEY};
    let db = migrated_db().await;
    let c = db.client().await;
    assert_eq!(pending(&c).await.unwrap(), None);
    let lock = db.client().await;
    lock.execute("SELECT pg_advisory_lock($1)", &[&MIGRATE_LOCK_KEY])
        .await
        .unwrap();
    assert_eq!(
        pending(&c).await.unwrap(),
        Some(Pending::Migrating(Some(latest_version())))
    );
    lock.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATE_LOCK_KEY])
        .await
        .unwrap();
    assert_eq!(pending(&c).await.unwrap(), None);
}
