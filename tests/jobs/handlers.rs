//! The `exec` and `sql` handlers, as configured on the command line.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::handlers::parse_flag;
use pgwake::{Worker, WorkerConfig};

const LONG: Duration = Duration::from_secs(60);

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

/// A function returning `{"pgwake_snooze": 3600}` snoozes its job: one
/// claim of three jobs where one snoozes runs them one by one, the
/// snoozing call's write is rolled back, its siblings' commit, and the
/// snoozed job waits an hour with no attempt used.
#[tokio::test]
async fn a_sql_function_returning_pgwake_snooze_snoozes_its_job_and_keeps_no_write() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA app;
             CREATE TABLE app.totals (n int);
             CREATE FUNCTION app.add(p jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO app.totals VALUES ((p->>'n')::int);
               IF (p->>'n')::int < 0 THEN RETURN jsonb_build_object('pgwake_snooze', 3600); END IF;
               RETURN NULL;
             END $$;",
        )
        .await
        .unwrap();
    let mut ids = Vec::new();
    for n in [5, -1, 7] {
        let job = NewJob::new("add", serde_json::json!({ "n": n })).max_attempts(1);
        ids.push(enqueue(&client, &job).await.unwrap());
    }
    let worker = worker_with(
        &db,
        &["add=sql:app.add"],
        WorkerConfig {
            concurrency: 1,
            batch: 10,
            ..test_config()
        },
    );
    assert_eq!(
        worker.claim_once().await.unwrap(),
        3,
        "one claim of all three"
    );
    let mut totals: Vec<i32> = client
        .query("SELECT n FROM app.totals", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    totals.sort();
    assert_eq!(
        totals,
        vec![5, 7],
        "the snoozing call's write was rolled back"
    );
    let row = client
        .query_one(
            "SELECT attempts, run_at > now() + interval '50 minutes', \
                    (SELECT snoozes FROM pgwake.job_snoozes WHERE job_id = j.id) \
             FROM pgwake.jobs j WHERE id = $1",
            &[&ids[1]],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 0, "no attempt used");
    assert!(row.get::<_, bool>(1), "due in an hour");
    assert_eq!(row.get::<_, Option<i32>>(2), Some(1));
    assert_eq!(remaining(&db).await, 1, "only the snoozed job waits");
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

/// `pgwake-exec-shim __exec-shim PPID PROGRAM ARGS…`, run from this test process
/// (its parent), with `ppid` as the worker's pid.
fn exec_shim(ppid: u32, command: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_pgwake-exec-shim"))
        .arg(pgwake::handlers::exec::EXEC_SHIM_ARG)
        .arg(ppid.to_string())
        .args(command)
        .output()
        .unwrap()
}

/// The exec shim starts its command only while its parent is still the
/// worker that spawned it: a worker that dies between the spawn and the
/// shim's `prctl` sends it no death signal, so the shim must notice the
/// new parent itself and end as the signal would have (SIGKILL). Without
/// the `getppid` check the command runs (the marker file is created).
#[test]
fn the_exec_shim_does_not_start_a_command_whose_worker_is_gone() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let touch = ["touch", marker.to_str().unwrap()];
    // This process is the shim's parent; any other pid is "the worker that
    // spawned it, now gone".
    let gone = exec_shim(std::process::id() + 1, &touch);
    assert_eq!(gone.status.signal(), Some(libc::SIGKILL), "{gone:?}");
    assert!(!marker.exists(), "the command ran without its worker");
    let alive = exec_shim(std::process::id(), &touch);
    assert!(alive.status.success(), "{alive:?}");
    assert!(marker.exists(), "the command did not run");
}

/// The shim, which now stays as the command's parent, ends as its command
/// did: the same exit status, or killed by the same signal (so
/// `last_error` says "exit status 3" or "killed by signal 11" as before).
#[test]
fn the_exec_shim_ends_as_its_command_did() {
    use std::os::unix::process::ExitStatusExt;
    let me = std::process::id();
    let exited = exec_shim(me, &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(exited.status.code(), Some(3), "{exited:?}");
    assert_eq!(String::from_utf8_lossy(&exited.stdout), "out\n");
    assert_eq!(String::from_utf8_lossy(&exited.stderr), "err\n");
    let killed = exec_shim(me, &["sh", "-c", "kill -SEGV $$"]);
    assert_eq!(killed.status.signal(), Some(libc::SIGSEGV), "{killed:?}");
    assert!(!killed.status.core_dumped(), "{killed:?}");
    assert!(exec_shim(me, &["true"]).status.success());
}

/// A program the shim cannot `exec` ends it with status 127 and one line
/// on stderr naming the program and the error, in the words the handler
/// uses without the shim.
#[test]
fn the_exec_shim_says_which_program_it_cannot_start() {
    let o = exec_shim(std::process::id(), &["/no/such/program", "--flag"]);
    assert_eq!(
        o.status.code(),
        Some(i32::from(pgwake::handlers::exec::EXIT_CANNOT_START))
    );
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "cannot start /no/such/program: No such file or directory (os error 2)\n"
    );
}

/// A command started by the `pgwake` binary (through the exec shim, with
/// `posix_spawn`) starts as one started by an embedding program (the
/// library's `pre_exec` path, here in-process): the same blocked signals
/// (none), SIGPIPE not ignored although the Rust runtime of the shim
/// ignores it (without the shim's reset before `exec`, the binary's
/// command has SIGPIPE in `SigIgn`), and, for a program that is gone by
/// the time its job runs, the same `last_error`.
#[tokio::test]
async fn an_exec_command_starts_alike_through_the_binary_and_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let script = d.join("vanishing");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let flags = |path: &str| {
        [
            format!(
                "sig=exec:sh -c 'exec grep ^Sig /proc/self/status > \"$0\"' {}/{path}.sig",
                d.display()
            ),
            format!("gone=exec:{}", script.display()),
        ]
    };
    let jobs = async |db: &TestDb| {
        let client = db.client().await;
        for task in ["sig", "gone"] {
            enqueue(
                &client,
                &NewJob::new(task, serde_json::json!({})).max_attempts(1),
            )
            .await
            .unwrap();
        }
    };
    let gone_reason = async |db: &TestDb| -> String {
        db.scalar("SELECT last_error FROM pgwake.dead_jobs WHERE task = 'gone'")
            .await
    };

    // In process: the handlers are parsed (the script checked) first.
    let local = migrated_db().await;
    let [sig, gone] = flags("local");
    let worker = worker_with(&local, &[&sig, &gone], test_config());
    // Through the binary, started (and its script checked) before the
    // script goes.
    let remote = migrated_db().await;
    let [sig, gone] = flags("binary");
    let mut child = spawn_pgwake_run(&remote.url, &["--handler", &sig, "--handler", &gone]);
    let log = tail_stderr(&mut child);
    eventually("the worker started", LONG, || async {
        log.lock().unwrap().contains("worker started")
    })
    .await;
    std::fs::remove_file(&script).unwrap();

    jobs(&local).await;
    let mut w = Running::start(worker);
    w.next_events(2, LONG, |_| true).await;
    w.shutdown().await;
    jobs(&remote).await;
    eventually("both jobs ended in the binary", LONG, || async {
        remaining(&remote).await == 0
            && remote
                .scalar::<i64>("SELECT count(*) FROM pgwake.leased_jobs")
                .await
                == 0
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    wait_exit(child, LONG).await;

    // (`SigIgn` may differ in glibc's internal signals 32 and 33, which its
    // `posix_spawn` leaves ignored in the new process.)
    let mask = |path: &str, field: &str| {
        let status = std::fs::read_to_string(d.join(format!("{path}.sig"))).unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
            .unwrap_or_else(|| panic!("no {field} in {status}"));
        (mask, status)
    };
    let sigpipe = 1 << (libc::SIGPIPE - 1);
    for path in ["local", "binary"] {
        let (ignored, status) = mask(path, "SigIgn:");
        assert_eq!(ignored & sigpipe, 0, "{path}: SIGPIPE ignored: {status}");
    }
    let (blocked, status) = mask("binary", "SigBlk:");
    assert_eq!(blocked, mask("local", "SigBlk:").0, "{status}");
    let reason = gone_reason(&local).await;
    let expected = format!(
        "cannot start {}: No such file or directory (os error 2)",
        script.display()
    );
    assert!(reason.starts_with(&expected), "{reason}");
    assert_eq!(gone_reason(&remote).await, reason);
}
