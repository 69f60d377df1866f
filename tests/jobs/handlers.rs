//! The `exec` and `sql` handlers, as configured on the command line.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::handlers::parse_flag;
use pgwake::{Worker, WorkerConfig};

fn worker_with(db: &TestDb, flags: &[&str], config: WorkerConfig) -> Worker {
    let mut b = Worker::builder(db.config()).config(config);
    for f in flags {
        let (task, h) = parse_flag(f).unwrap();
        b = b.handler_arc(&task, h);
    }
    b.build().unwrap()
}

#[tokio::test]
async fn exec_handler_gets_the_payload_on_stdin_and_the_job_in_its_environment() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let flag = format!(
        "resize=exec:sh -c 'cat > {0}.stdin; env | grep ^PGWAKE_ | sort > {0}.env'",
        out.display()
    );
    let client = db.client().await;
    let payload = serde_json::json!({"image": "a b.jpg", "nested": {"x": [1, null, "é"]}});
    let id = enqueue(
        &client,
        &NewJob::new("resize", payload.clone()).queue("images"),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker_with(&db, &[&flag], test_config()));
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "done", "{:?}", ev[0].error());
    let stdin: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{}.stdin", out.display())).unwrap())
            .unwrap();
    assert_eq!(stdin, payload);
    let env = std::fs::read_to_string(format!("{}.env", out.display())).unwrap();
    assert_eq!(
        env,
        format!("PGWAKE_ATTEMPT=1\nPGWAKE_JOB_ID={id}\nPGWAKE_QUEUE=images\nPGWAKE_TASK=resize\n")
    );
}

#[tokio::test]
async fn a_failing_command_fails_the_attempt_with_its_stderr_tail() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("bad", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    let flag = "bad=exec:sh -c 'echo starting; echo \"disk full\" >&2; exit 3'";
    let mut w = Running::start(worker_with(&db, &[flag], test_config()));
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "dead");
    let err = dead_reason(&client, id).await;
    assert!(err.contains("exit status 3: disk full"), "{err}");
}

#[tokio::test]
async fn a_command_past_the_job_timeout_is_killed_with_its_children() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let client = db.client().await;
    let id = enqueue(
        &client,
        &NewJob::new("hang", serde_json::json!({})).max_attempts(1),
    )
    .await
    .unwrap();
    // The shell starts a child and waits: both must die at the timeout.
    let flag = format!(
        "hang=exec:sh -c 'sleep 3600 & echo $! > {}; wait'",
        pidfile.display()
    );
    let mut w = Running::start(worker_with(
        &db,
        &[&flag],
        WorkerConfig {
            job_timeout: Duration::from_millis(500),
            ..test_config()
        },
    ));
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert_eq!((ev[0].id, ev[0].outcome()), (id, "dead"));
    assert!(ev[0].error().unwrap_or("").contains("timed out"));
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    eventually(
        "the grandchild is gone",
        Duration::from_secs(10),
        || async move {
            // SAFETY: signal 0 only checks for existence.
            unsafe { libc::kill(pid, 0) != 0 }
        },
    )
    .await;
}

#[test]
fn a_command_that_does_not_exist_is_refused_at_start() {
    let err = parse_flag("t=exec:/no/such/binary --flag")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not found"), "{err}");
    let err = parse_flag("t=exec:definitely-not-a-command-pgwake")
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not found"), "{err}");
    for bad in [
        "t",
        "=exec:true",
        "t=exec:",
        "t=python:x",
        "t=sql:a.b.c",
        "t=sql:drop table x",
        "t=sql:x;y",
    ] {
        assert!(parse_flag(bad).is_err(), "{bad} must be refused");
    }
}

#[tokio::test]
async fn sql_handler_runs_the_function_inside_the_claim_transaction() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA app;
             CREATE TABLE app.totals (n int);
             CREATE FUNCTION app.add(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
               IF (p->>'n')::int < 0 THEN RAISE EXCEPTION 'negative n: %', p->>'n'; END IF;
               INSERT INTO app.totals VALUES ((p->>'n')::int);
             END $$;",
        )
        .await
        .unwrap();
    let good = enqueue(&client, &NewJob::new("add", serde_json::json!({"n": 5})))
        .await
        .unwrap();
    let bad = enqueue(
        &client,
        &NewJob::new("add", serde_json::json!({"n": -1})).max_attempts(1),
    )
    .await
    .unwrap();
    let mut w = Running::start(worker_with(
        &db,
        &["add=sql:app.add"],
        WorkerConfig {
            concurrency: 1,
            batch: 10,
            ..test_config()
        },
    ));
    let evs = w.next_events(2, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    let by_id = |id| evs.iter().find(|e| e.id == id).unwrap().outcome();
    assert_eq!(by_id(good), "done");
    assert_eq!(by_id(bad), "dead");
    let totals: Vec<i32> = client
        .query("SELECT n FROM app.totals", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        totals,
        vec![5],
        "the raising call's write was rolled back, the good one committed"
    );
    let err = dead_reason(&client, bad).await;
    assert!(
        err.contains("negative n: -1") && err.contains("P0001"),
        "{err}"
    );
}

/// One claim of several `sql` jobs runs them as one statement in a
/// savepoint sent ahead of it (released ahead too); when one call raises,
/// the group is rolled back and each job runs in its own savepoint: the
/// raising call's write alone is undone, its siblings' commit.
#[tokio::test]
async fn in_one_claim_a_raising_sql_call_rolls_back_only_its_own_write() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA app;
             CREATE TABLE app.totals (n int);
             CREATE FUNCTION app.add(p jsonb) RETURNS void LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO app.totals VALUES ((p->>'n')::int);
               IF (p->>'n')::int < 0 THEN RAISE EXCEPTION 'negative n: %', p->>'n'; END IF;
             END $$;",
        )
        .await
        .unwrap();
    let worker = || {
        worker_with(
            &db,
            &["add=sql:app.add"],
            WorkerConfig {
                concurrency: 1,
                batch: 10,
                ..test_config()
            },
        )
    };
    let totals = || async {
        let mut n: Vec<i32> = client
            .query("SELECT n FROM app.totals", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        n.sort();
        n
    };
    // Every call succeeds: the one statement's writes commit.
    for n in [1, 2, 3] {
        enqueue(&client, &NewJob::new("add", serde_json::json!({ "n": n })))
            .await
            .unwrap();
    }
    assert_eq!(worker().claim_once().await.unwrap(), 3);
    assert_eq!(totals().await, vec![1, 2, 3]);
    assert_eq!(remaining(&db).await, 0);
    // One raises.
    let mut ids = Vec::new();
    for n in [5, -1, 7] {
        let job = NewJob::new("add", serde_json::json!({ "n": n })).max_attempts(1);
        ids.push(enqueue(&client, &job).await.unwrap());
    }
    assert_eq!(
        worker().claim_once().await.unwrap(),
        3,
        "one claim of all three"
    );
    assert_eq!(
        totals().await,
        vec![1, 2, 3, 5, 7],
        "the raising call's write was rolled back, its siblings' committed"
    );
    assert_eq!(remaining(&db).await, 0);
    let err = dead_reason(&client, ids[1]).await;
    assert!(err.contains("negative n: -1"), "{err}");
}

#[tokio::test]
async fn a_sql_handler_naming_a_missing_function_stops_the_worker_at_start() {
    let db = migrated_db().await;
    let worker = worker_with(&db, &["t=sql:public.nope"], test_config());
    let err = worker
        .run(Default::default(), Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("does not exist"), "{err}");
}

#[tokio::test]
async fn the_catch_all_handler_takes_every_task() {
    let db = migrated_db().await;
    let client = db.client().await;
    for task in ["a", "weird task \"name\"", "ünïcødé"] {
        enqueue(&client, &NewJob::new(task, serde_json::Value::Null))
            .await
            .unwrap();
    }
    let mut w = Running::start(worker_with(&db, &["*=exec:true"], test_config()));
    let evs = w.next_events(3, Duration::from_secs(30), |_| true).await;
    w.shutdown().await;
    assert!(evs.iter().all(|e| e.outcome() == "done"), "{evs:?}");
}
