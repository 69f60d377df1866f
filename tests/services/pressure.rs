//! The governor (`pgwake.pressure()`): its level follows a real pinned
//! horizon and names the holder, it leaves a level only below the leave
//! thresholds (hysteresis), each change is made and logged once however
//! many callers race, nonsense thresholds are refused with their range, and
//! a role that cannot see every session gets a reading that says so and
//! changes nothing, as does a read-only transaction; a prepared transaction
//! drives the level like a session, and a logical slot and a streaming
//! standby with feedback are reported beside it.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::admin::pressure::{self, Level, Pressure};

const WAIT: Duration = Duration::from_secs(30);

async fn reading(c: &tokio_postgres::Client) -> Pressure {
    pressure::read(c).await.unwrap()
}

fn cause<'a>(p: &'a Pressure, kind: &str) -> Option<&'a pressure::Cause> {
    p.causes.iter().find(|c| c.kind == kind)
}

/// The log's (previous, level) pairs, oldest first.
async fn log(c: &tokio_postgres::Client) -> Vec<(String, String)> {
    c.query(
        "SELECT previous, level FROM pgwake.pressure_log ORDER BY id",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// A session of `db` that holds a REPEATABLE READ snapshot open, idle in
/// transaction, and its pid.
async fn pin_horizon(db: &TestDb, application_name: &str) -> (tokio_postgres::Client, i32) {
    let pin = connect_as(db, application_name).await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    let pid: i32 = pin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (pin, pid)
}

async fn wait_level(c: &tokio_postgres::Client, level: Level) -> Pressure {
    wait_for(&format!("pressure level {level}"), WAIT, async || {
        let p = reading(c).await;
        if p.level == level {
            Ok(p)
        } else {
            Err(format!("{p:?}"))
        }
    })
    .await
}

#[tokio::test]
async fn the_level_follows_a_pinned_horizon_names_its_holder_and_falls_when_it_ends() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 2)",
    )
    .await
    .unwrap();
    assert_eq!(reading(&c).await.level, Level::Ok);

    let (pin, pid) = pin_horizon(&db, "metabase").await;
    let elevated = wait_level(&c, Level::Elevated).await;
    let critical = wait_level(&c, Level::Critical).await;
    for p in [&elevated, &critical] {
        let h = cause(p, "horizon").expect("a horizon cause");
        assert_eq!(h.fields["pid"], pid, "{h:?}");
        assert_eq!(h.fields["application_name"], "metabase", "{h:?}");
        assert_eq!(h.fields["state"], "idle in transaction", "{h:?}");
        assert!(h.detail.starts_with("horizon held "), "{}", h.detail);
        assert!(
            h.detail.contains(&format!("by pid {pid} (metabase)")),
            "{}",
            h.detail
        );
    }
    assert_eq!(cause(&critical, "horizon").unwrap().level, "critical");

    pin.batch_execute("COMMIT").await.unwrap();
    let ok = wait_level(&c, Level::Ok).await;
    assert!(cause(&ok, "horizon").is_none(), "{ok:?}");
    assert_eq!(
        log(&c).await,
        [
            ("ok", "elevated"),
            ("elevated", "critical"),
            ("critical", "ok")
        ]
        .map(|(a, b)| (a.to_string(), b.to_string())),
        "one log row per change"
    );
    let state: (String, serde_json::Value) = c
        .query_one("SELECT level, causes FROM pgwake.pressure_state", &[])
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(state.0, "ok");
}

#[tokio::test]
async fn a_level_is_left_only_below_the_leave_threshold() {
    let db = migrated_db().await;
    let c = db.client().await;
    // Dead tuples are the measure a test sets exactly: no vacuum removes
    // them while it runs, and the thresholds move around the measured value.
    c.batch_execute(
        "ALTER TABLE pgwake.jobs SET (autovacuum_enabled = false);
         ALTER TABLE pgwake.leased_jobs SET (autovacuum_enabled = false);
         ALTER TABLE pgwake.tx_batches SET (autovacuum_enabled = false);
         SELECT pgwake.set_pressure_thresholds(dead_tuples_elevated => 100, dead_tuples_critical => 100000, leave_ratio => 0.5);",
    )
    .await
    .unwrap();
    insert_jobs(&db, "t", 300).await;
    c.batch_execute("DELETE FROM pgwake.jobs; SELECT pg_stat_force_next_flush();")
        .await
        .unwrap();
    let elevated = wait_level(&c, Level::Elevated).await;
    let dead = cause(&elevated, "dead_tuples").expect("a dead_tuples cause");
    let v = dead.fields["value"].as_i64().unwrap();
    assert!(v >= 300, "{dead:?}");

    let set = |elevated: i64| {
        let c = &c;
        async move {
            c.execute(
                "SELECT pgwake.set_pressure_thresholds(dead_tuples_elevated => $1, dead_tuples_critical => $2)",
                &[&elevated, &(elevated * 1000)],
            )
            .await
            .unwrap();
        }
    };
    // Below the enter threshold, above the leave one (v + 1 > v ≥ (v + 1) / 2):
    // the level stays.
    set(v + 1).await;
    let stays = reading(&c).await;
    assert_eq!(stays.level, Level::Elevated, "{stays:?}");
    assert!(!stays.changed);
    assert_eq!(cause(&stays, "dead_tuples").unwrap().level, "elevated");
    // Below the leave threshold ((2v + 2) / 2 = v + 1 > v): it falls.
    set(2 * v + 2).await;
    let falls = reading(&c).await;
    assert_eq!(falls.level, Level::Ok, "{falls:?}");
    assert!(falls.changed);
    assert_eq!(falls.previous, Level::Elevated);
    // And from ok, a value between leave and enter does not raise it.
    set(v + 1).await;
    let rests = reading(&c).await;
    assert_eq!(rests.level, Level::Ok, "{rests:?}");
    assert!(!rests.changed);
    assert_eq!(
        log(&c).await,
        [("ok", "elevated"), ("elevated", "ok")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
}

#[tokio::test]
async fn each_change_is_made_and_logged_once_however_many_callers_race() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 2)",
        )
        .await
        .unwrap();
    let (pin, _) = pin_horizon(&db, "long report").await;
    // The callers read in lock step (a barrier before each call), so that
    // when the horizon crosses a threshold they all measure the change
    // against the same recorded level at once.
    const CALLERS: usize = 6;
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(CALLERS));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        let c = db.client().await;
        let (start, done) = (start.clone(), done.clone());
        callers.push(tokio::spawn(async move {
            let mut changes = Vec::new();
            loop {
                start.wait().await;
                let p = pressure::read(&c).await.unwrap();
                if p.changed {
                    changes.push((p.previous, p.level));
                }
                if p.level == Level::Critical {
                    done.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                start.wait().await;
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    return changes;
                }
            }
        }));
    }
    let mut changes = Vec::new();
    for c in callers {
        changes.extend(
            tokio::time::timeout(WAIT, c)
                .await
                .expect("every caller sees critical")
                .unwrap(),
        );
    }
    changes.sort();
    assert_eq!(
        changes,
        [
            (Level::Ok, Level::Elevated),
            (Level::Elevated, Level::Critical)
        ],
        "each change reported changed to exactly one caller"
    );
    let c = db.client().await;
    assert_eq!(
        log(&c).await,
        [("ok", "elevated"), ("elevated", "critical")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    drop(pin);
}

#[tokio::test]
async fn nonsense_thresholds_are_refused_with_their_range() {
    let db = migrated_db().await;
    let c = db.client().await;
    let before: serde_json::Value = c
        .query_one("SELECT to_jsonb(s) FROM pgwake.pressure_settings s", &[])
        .await
        .unwrap()
        .get(0);
    for (call, range) in [
        (
            "horizon_elevated_seconds => 600",
            "0 < elevated < critical <= 604800 seconds",
        ),
        (
            "horizon_elevated_seconds => 0",
            "0 < elevated < critical <= 604800 seconds",
        ),
        ("dead_tuples_elevated => -1", "0 < elevated < critical"),
        (
            "dead_tuples_elevated => 10, dead_tuples_critical => 10",
            "0 < elevated < critical",
        ),
        ("notify_critical => 1.5", "0 < elevated < critical <= 1"),
        ("leave_ratio => 1", "leave_ratio must be in (0, 1)"),
        ("leave_ratio => 0", "leave_ratio must be in (0, 1)"),
    ] {
        let e = c
            .batch_execute(&format!("SELECT pgwake.set_pressure_thresholds({call})"))
            .await
            .unwrap_err();
        let msg = e.as_db_error().unwrap().message().to_string();
        assert!(msg.contains(range), "{call}: {msg}");
        assert_eq!(e.code().unwrap().code(), "22023", "{call}: {msg}");
    }
    // The table refuses them too, whoever writes it.
    let e = c
        .batch_execute("UPDATE pgwake.pressure_settings SET leave_ratio = 2")
        .await
        .unwrap_err();
    assert_eq!(e.code().unwrap().code(), "23514", "{e}");
    let after: serde_json::Value = c
        .query_one("SELECT to_jsonb(s) FROM pgwake.pressure_settings s", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(before, after, "nothing was changed");
    // A sensible change is taken and returned.
    let set: serde_json::Value = c
        .query_one(
            "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 30)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(set["horizon_elevated_seconds"], 30.0);
    assert_eq!(set["horizon_critical_seconds"], 300.0);
}

/// A login role of `db` with the worker grants (and pg_monitor when
/// `monitor`), its name unique to this database.
async fn worker_role(db: &TestDb, suffix: &str, monitor: bool) -> tokio_postgres::Client {
    let role = format!("{}_{suffix}", db.name);
    let c = db.client().await;
    c.batch_execute(&format!(
        "CREATE ROLE {role} LOGIN PASSWORD 'pw';
         GRANT CONNECT ON DATABASE {} TO {role};
         SELECT pgwake.grant_worker('{role}');
         {}",
        db.name,
        if monitor {
            format!("GRANT pg_monitor TO {role};")
        } else {
            String::new()
        }
    ))
    .await
    .unwrap();
    let mut cfg = db.config();
    cfg.user(&role);
    cfg.password("pw");
    pgwake::connect::connect(&cfg).await.unwrap()
}

#[tokio::test]
async fn a_role_without_pg_read_all_stats_or_a_read_only_transaction_changes_nothing() {
    let db = migrated_db().await;
    let admin = db.client().await;
    admin
        .batch_execute(
            "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 1000)",
        )
        .await
        .unwrap();
    let blind = worker_role(&db, "blind", false).await;
    let seeing = worker_role(&db, "seeing", true).await;
    // The superuser's session holds the horizon; a role with pg_monitor
    // sees it and records the level.
    let (pin, pid) = pin_horizon(&db, "analytics").await;
    let p = wait_level(&seeing, Level::Elevated).await;
    assert!(cause(&p, "visibility").is_none(), "{p:?}");
    assert_eq!(cause(&p, "horizon").unwrap().fields["pid"], pid);
    assert!(p.changed);

    // A role without pg_read_all_stats cannot see that transaction: its
    // reading says so, without an error, and does not lower the level.
    let p = reading(&blind).await;
    let v = cause(&p, "visibility").expect("a visibility cause");
    assert!(v.detail.contains("pg_read_all_stats"), "{}", v.detail);
    assert!(v.detail.contains("GRANT pg_monitor TO"), "{}", v.detail);
    assert!(cause(&p, "horizon").is_none(), "{p:?}");
    assert!(!p.changed, "{p:?}");
    let recorded: String = admin
        .query_one("SELECT level FROM pgwake.pressure_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, "elevated", "a partial view records nothing");

    // A read-only transaction (a standby, a console) reads without an
    // error and records nothing either.
    pin.batch_execute("COMMIT").await.unwrap();
    let ro = db.client().await;
    ro.batch_execute("BEGIN READ ONLY").await.unwrap();
    let p = wait_for("a reading that would fall to ok", WAIT, async || {
        let p = reading(&ro).await;
        if p.level == Level::Ok {
            Ok(p)
        } else {
            Err(format!("{p:?}"))
        }
    })
    .await;
    assert!(!p.changed && p.previous == Level::Elevated, "{p:?}");
    ro.batch_execute("COMMIT").await.unwrap();
    let recorded: String = admin
        .query_one("SELECT level FROM pgwake.pressure_state", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(recorded, "elevated", "a read-only reading records nothing");
    admin
        .batch_execute(&format!(
            "DROP OWNED BY {0}_blind, {0}_seeing; DROP ROLE {0}_blind; DROP ROLE {0}_seeing;",
            db.name
        ))
        .await
        .ok();
}

/// The other holders a production database meets, each made for real on a
/// private cluster: a prepared transaction holds the horizon (a cause that
/// drives the level, naming its gid and the fix); a logical replication
/// slot and a streaming standby with `hot_standby_feedback` are reported
/// beside the level, as information, and drive nothing (their hold is an
/// age in transactions, not seconds).
#[tokio::test]
async fn a_prepared_transaction_drives_the_level_and_slots_and_standbys_are_reported() {
    let (cluster, db) = private_cluster_db_with(&[
        ("max_prepared_transactions", "2"),
        ("wal_level", "logical"),
        ("hot_standby_feedback", "on"),
    ])
    .await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 3600);
         CREATE TABLE imports (id int)",
    )
    .await
    .unwrap();

    // A prepared transaction that took an xid: it holds the horizon with no
    // session at all.
    let importer = db.client().await;
    importer
        .batch_execute(
            "BEGIN; INSERT INTO imports VALUES (1); PREPARE TRANSACTION 'nightly-import';",
        )
        .await
        .unwrap();
    drop(importer);
    let elevated = wait_level(&c, Level::Elevated).await;
    let h = cause(&elevated, "horizon").expect("a horizon cause");
    assert_eq!(h.fields["holder"], "prepared transaction", "{h:?}");
    assert_eq!(h.fields["gid"], "nightly-import", "{h:?}");
    assert!(
        h.detail
            .contains("by prepared transaction 'nightly-import'")
            && h.detail.contains("ROLLBACK PREPARED"),
        "{}",
        h.detail
    );
    c.batch_execute("ROLLBACK PREPARED 'nightly-import'")
        .await
        .unwrap();
    wait_level(&c, Level::Ok).await;

    // A logical slot (its catalog_xmin) and a standby whose feedback holds
    // an xmin: reported, level unchanged.
    c.batch_execute("SELECT pg_create_logical_replication_slot('cdc', 'test_decoding')")
        .await
        .unwrap();
    let standby = tokio::task::spawn_blocking(move || {
        let standby = cluster.start_standby().expect("pg_basebackup a standby");
        (cluster, standby)
    })
    .await
    .unwrap();
    let p = wait_for("the standby's feedback in the reading", WAIT, async || {
        let p = reading(&c).await;
        match cause(&p, "replication") {
            Some(r) if !r.fields["xmin_age"].is_null() => Ok(p),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(
        p.level,
        Level::Ok,
        "slots and standbys drive nothing: {p:?}"
    );
    let slot = cause(&p, "replication_slot").expect("a slot cause");
    assert_eq!(slot.level, "info");
    assert_eq!(slot.fields["slot"], "cdc", "{slot:?}");
    assert!(
        slot.detail
            .starts_with("logical replication slot 'cdc' (inactive: drop it"),
        "{}",
        slot.detail
    );
    let replica = cause(&p, "replication").unwrap();
    assert_eq!(replica.level, "info");
    assert!(
        replica.detail.starts_with("standby ")
            && replica.detail.contains("its feedback holds an xmin"),
        "{}",
        replica.detail
    );
    c.batch_execute("SELECT pg_drop_replication_slot('cdc')")
        .await
        .unwrap();
    drop(standby);
}

/// While the vacuum horizon is held the worker's sampler reads the
/// per-queue gauges only once per several intervals
/// (`PRESSURE_QUEUE_GAUGES_EVERY`: each count walks the dead index entries
/// the held horizon keeps); a sample without them leaves the queue gauges
/// at their last values and still publishes the rest, here a queue paused
/// meanwhile. Fails with a partial sample published as if it had read the
/// queues (the depth falls to 0) or not published at all (the pause unseen).
#[tokio::test(flavor = "current_thread")]
async fn a_sample_without_the_queue_gauges_keeps_their_last_values_and_publishes_the_rest() {
    let handle = pgwake::metrics::install();
    let db = migrated_db().await;
    let c = db.client().await;
    let q = format!("partial_{}", std::process::id());
    let insert = |n: i32| {
        format!(
            "INSERT INTO pgwake.jobs (queue, task) SELECT '{q}', 't' FROM generate_series(1, {n})"
        )
    };
    c.batch_execute(&insert(3)).await.unwrap();
    let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
    let mut sampler = pgwake::internal::sampler::Sampler::new(
        pool.clone(),
        pgwake::internal::sampler::SamplerConfig::every(Duration::from_secs(60)),
        std::sync::Arc::new(pgwake::Health::new(false)),
    );
    let gauge = |name: &str| -> String {
        let text = handle.render();
        text.lines()
            .find(|l| l.starts_with(name) && l.contains(&format!("queue=\"{q}\"")))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_default()
            .to_string()
    };
    let depth = "pgwake_queue_depth{queue=";
    let ready_depth = || {
        let text = handle.render();
        text.lines()
            .find(|l| {
                l.starts_with(depth)
                    && l.contains(&format!("queue=\"{q}\""))
                    && l.contains("state=\"ready\"")
            })
            .and_then(|l| l.rsplit(' ').next())
            .unwrap_or_default()
            .to_string()
    };
    sampler.publish(
        &pgwake::internal::sampler::sample(&pool, pgwake::internal::sampler::DEPTH_CAP_DEFAULT)
            .await
            .unwrap(),
    );
    assert_eq!(ready_depth(), "3");

    c.batch_execute(&format!("{}; SELECT pgwake.pause_queue('{q}')", insert(2)))
        .await
        .unwrap();
    let partial = pgwake::internal::sampler::sample_parts(
        &pool,
        pgwake::internal::sampler::DEPTH_CAP_DEFAULT,
        Some(pgwake::internal::sampler::TIME_LIMIT_DEFAULT),
        false,
    )
    .await
    .unwrap();
    assert!(!partial.queues_read && partial.queues.is_empty());
    sampler.publish(&partial);
    assert_eq!(
        ready_depth(),
        "3",
        "the queue gauges keep their last values"
    );
    assert_eq!(gauge("pgwake_queue_paused{"), "1", "the rest is published");

    sampler.publish(
        &pgwake::internal::sampler::sample(&pool, pgwake::internal::sampler::DEPTH_CAP_DEFAULT)
            .await
            .unwrap(),
    );
    assert_eq!(ready_depth(), "5", "the next full sample reads them again");
}
