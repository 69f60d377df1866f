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
        // jobs_add_key_slots: per-key limits (migration 0020); jobs_bounds:
        // a new job's task name and payload (0027); the limit-key-path
        // trigger exists only once a queue has a path; jobs_trace_context:
        // a transaction's trace context (0038, functions/traces.sql);
        // jobs_release_children: a parent's end (0039, functions/flows.sql).
        "jobs_add_key_slots,jobs_bounds,jobs_hold_ordering_key,jobs_hold_unique_key,jobs_notify,jobs_record_error,\
         jobs_release_children,jobs_release_ordering_key,jobs_trace_context",
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
        let mut opts = pgwake::admin::schema::MigrateOptions::default();
        opts.lock_timeout = std::time::Duration::from_millis(200);
        opts.lock_retries = 10_000;
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

/// The schema at the latest version plus `extra`, a test-only migration.
async fn migrate_with_extra(
    db: &TestDb,
    extra: &[pgwake::admin::schema::Migration],
) -> pgwake::error::Result<pgwake::admin::schema::MigrateReport> {
    let mut list = pgwake::admin::schema::MIGRATIONS.to_vec();
    list.extend_from_slice(extra);
    let mut c = db.client().await;
    pgwake::admin::schema::migrate_list(&mut c, &Default::default(), &list).await
}

async fn index_valid(db: &TestDb, name: &str) -> Option<bool> {
    db.client()
        .await
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
             WHERE c.relnamespace = 'pgwake'::regnamespace AND c.relname = $1",
            &[&name],
        )
        .await
        .unwrap()
        .map(|r| r.get(0))
}

/// Issue 33, item 15: a `-- pgwake:step no-transaction` step runs outside
/// any transaction (CREATE INDEX CONCURRENTLY refuses to run in one), and
/// a run stopped between steps resumes after the last one done: the first
/// step (a CREATE TABLE without IF NOT EXISTS) is not run again.
#[tokio::test]
async fn a_migration_in_steps_builds_its_index_concurrently_and_resumes_after_a_failed_step() {
    let db = migrated_db().await;
    let online = pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_online.sql",
        sql: "-- A sample online migration.
CREATE TABLE pgwake.online_t (id bigint PRIMARY KEY, x integer);
INSERT INTO pgwake.online_t SELECT g, g % 7 FROM generate_series(1, 1000) g;
-- pgwake:step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS online_t_x ON pgwake.online_t (x);
-- pgwake:step
INSERT INTO pgwake.online_t_later (note) VALUES ('after the index');
",
    };
    let steps = pgwake::admin::schema::steps(online).unwrap();
    assert_eq!(
        steps.iter().map(|s| s.transaction).collect::<Vec<_>>(),
        [true, false, true]
    );
    // The third step fails (its table is missing): the first two stay done.
    let err = migrate_with_extra(&db, &[online]).await.unwrap_err();
    assert!(format!("{err:?}").contains("online_t_later"), "{err:?}");
    assert_eq!(index_valid(&db, "online_t_x").await, Some(true));
    let done: String = db
        .scalar("SELECT string_agg(step::text, ',' ORDER BY step) FROM pgwake.schema_migration_steps WHERE version = 9001")
        .await;
    assert_eq!(done, "0,1");
    let version: i32 = db
        .scalar("SELECT max(version) FROM pgwake.schema_migrations")
        .await;
    assert!(version < 9001);

    // Fixed, the next run resumes at the third step.
    db.client()
        .await
        .batch_execute("CREATE TABLE pgwake.online_t_later (note text)")
        .await
        .unwrap();
    let report = migrate_with_extra(&db, &[online]).await.unwrap();
    assert_eq!(report.applied, vec![9001]);
    let rows: i64 = db.scalar("SELECT count(*) FROM pgwake.online_t").await;
    assert_eq!(rows, 1000, "the first step ran once");
    let notes: i64 = db
        .scalar("SELECT count(*) FROM pgwake.online_t_later")
        .await;
    assert_eq!(notes, 1);
    let left: i64 = db
        .scalar("SELECT count(*) FROM pgwake.schema_migration_steps")
        .await;
    assert_eq!(left, 0, "a finished migration leaves no step rows");
}

/// Issue 33, item 15: a concurrent build that failed leaves an INVALID
/// index, which `IF NOT EXISTS` would keep (never used, yet updated by every
/// insert); the next run drops it and builds it again.
#[tokio::test]
async fn an_invalid_index_left_by_a_failed_concurrent_build_is_built_again() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "CREATE TABLE pgwake.online_u (id bigint PRIMARY KEY, x integer);
             INSERT INTO pgwake.online_u VALUES (1, 1), (2, 1);",
        )
        .await
        .unwrap();
    let online = pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_online_unique.sql",
        sql: "-- pgwake:step no-transaction
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS online_u_x ON pgwake.online_u (x);
-- pgwake:step
ALTER TABLE pgwake.online_u ADD COLUMN y integer;
",
    };
    // The duplicate makes the build fail halfway: the index is left invalid.
    migrate_with_extra(&db, &[online]).await.unwrap_err();
    assert_eq!(index_valid(&db, "online_u_x").await, Some(false));
    db.client()
        .await
        .batch_execute("DELETE FROM pgwake.online_u WHERE id = 2")
        .await
        .unwrap();
    let report = migrate_with_extra(&db, &[online]).await.unwrap();
    assert_eq!(report.applied, vec![9001]);
    assert_eq!(index_valid(&db, "online_u_x").await, Some(true));
}

/// A migration that is one no-transaction step (after comments) is not
/// run in a transaction either.
#[tokio::test]
async fn a_migration_of_one_no_transaction_step_runs_outside_a_transaction() {
    let db = migrated_db().await;
    let online = pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_one_step.sql",
        sql: "-- An index, online.
-- pgwake:step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_one_step ON pgwake.jobs (created_at);
",
    };
    let report = migrate_with_extra(&db, &[online]).await.unwrap();
    assert_eq!(report.applied, vec![9001]);
    assert_eq!(index_valid(&db, "jobs_one_step").await, Some(true));
}

/// A backfill in batches: a no-transaction step calls a procedure that
/// commits after each batch (a transaction step could not).
#[tokio::test]
async fn a_no_transaction_step_backfills_in_committed_batches() {
    let db = migrated_db().await;
    let online = pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_backfill.sql",
        sql: "CREATE TABLE pgwake.online_b (id bigint PRIMARY KEY, y integer);
INSERT INTO pgwake.online_b SELECT g, NULL FROM generate_series(1, 25000) g;
CREATE TABLE pgwake.online_b_batches (at timestamptz NOT NULL DEFAULT clock_timestamp(), xid xid8 NOT NULL);
CREATE PROCEDURE pgwake.online_b_backfill() LANGUAGE plpgsql AS $$
DECLARE n bigint;
BEGIN
    LOOP
        UPDATE pgwake.online_b SET y = id % 10
        WHERE id IN (SELECT id FROM pgwake.online_b WHERE y IS NULL ORDER BY id LIMIT 10000);
        GET DIAGNOSTICS n = ROW_COUNT;
        EXIT WHEN n = 0;
        INSERT INTO pgwake.online_b_batches (xid) VALUES (pg_current_xact_id());
        COMMIT;
    END LOOP;
END
$$;
-- pgwake:step no-transaction
CALL pgwake.online_b_backfill();
-- pgwake:step
DROP PROCEDURE pgwake.online_b_backfill();
",
    };
    migrate_with_extra(&db, &[online]).await.unwrap();
    let missing: i64 = db
        .scalar("SELECT count(*) FROM pgwake.online_b WHERE y IS NULL")
        .await;
    assert_eq!(missing, 0);
    let transactions: i64 = db
        .scalar("SELECT count(DISTINCT xid) FROM pgwake.online_b_batches")
        .await;
    assert_eq!(transactions, 3, "three batches, each committed on its own");
}

#[test]
fn a_concurrent_index_step_must_say_if_not_exists() {
    let m = pgwake::admin::schema::Migration {
        version: 9001,
        name: "9001_bad.sql",
        sql:
            "-- pgwake:step no-transaction\nCREATE INDEX CONCURRENTLY bad ON pgwake.jobs (task);\n",
    };
    let err = pgwake::admin::schema::steps(m).unwrap_err().to_string();
    assert!(err.contains("IF NOT EXISTS"), "{err}");
    // Every shipped migration parses.
    for m in pgwake::admin::schema::MIGRATIONS {
        pgwake::admin::schema::steps(*m).unwrap();
    }
}

/// Several `pgwake migrate` at once (a Deployment's replicas, a migrate
/// Job retried beside a manual one) while a migration builds an index
/// concurrently: the build waits for every transaction that holds a
/// snapshot, and a migrate waiting for the migration lock inside a
/// `SELECT pg_advisory_lock(…)` was one, waiting in turn for the build's
/// session: a deadlock (found when the flows migration first built its
/// index concurrently). Waiting migrates now hold no transaction between
/// tries. Teeth: with the blocking `pg_advisory_lock` the build and a
/// waiter deadlock (one fails with "deadlock detected").
#[tokio::test]
async fn concurrent_migrates_do_not_deadlock_a_concurrent_index_build() {
    let db = empty_db().await;
    let online = pgwake::admin::schema::Migration {
        version: 9002,
        name: "9002_online_index.sql",
        sql: "-- pgwake:step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_task_online ON pgwake.jobs (task);
",
    };
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let url = db.url.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&url).unwrap())
                .await
                .unwrap();
            let mut list = pgwake::admin::schema::MIGRATIONS.to_vec();
            list.push(online);
            pgwake::admin::schema::migrate_list(&mut c, &Default::default(), &list).await
        }));
    }
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(t.await.unwrap().expect("every migrate succeeds").applied);
    }
    assert_eq!(applied.iter().filter(|v| **v == 9002).count(), 1);
    assert_eq!(index_valid(&db, "jobs_task_online").await, Some(true));
}
