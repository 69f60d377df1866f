//! The `pgwake` binary: errors, one-shot commands, and shutdown by signal.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::*;
use common::{run_pgwake as run, stderr_of as stderr};

#[test]
fn a_malformed_database_url_exits_2_without_echoing_the_password() {
    let o = run(
        &["migrate"],
        Some("postgres://app:s3cretpw@db.example:notaport/app"),
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("invalid database URL"), "{e}");
    assert!(!e.contains("s3cretpw"), "{e}");
}

#[test]
fn an_unreachable_database_exits_1_with_a_hint_and_no_password() {
    let o = run(
        &[
            "run",
            "--fail-fast",
            "--handler",
            "t=exec:true",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        Some("postgres://app:s3cretpw@127.0.0.1:1/app?connect_timeout=2"),
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(e.contains("cannot connect to the database"), "{e}");
    assert!(e.contains("check the host and port (DATABASE_URL)"), "{e}");
    assert!(!e.contains("s3cretpw"), "{e}");
}

#[test]
fn no_database_url_at_all_exits_2() {
    let o = run(&["stats"], None);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("set DATABASE_URL"), "{}", stderr(&o));
}

#[tokio::test]
async fn a_missing_schema_says_to_run_migrate() {
    let db = empty_db().await;
    // --fail-fast: without it the worker waits for the migration
    // (tests/observability.rs).
    let o = run(
        &[
            "run",
            "--fail-fast",
            "--handler",
            "t=exec:true",
            "--metrics-addr",
            "127.0.0.1:0",
        ],
        Some(&db.url),
    );
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.lines()
            .any(|l| l.contains("schema is missing") && l.contains("run `pgwake migrate`")),
        "{e}"
    );
}

#[test]
fn invalid_flags_exit_2_naming_the_flag() {
    let url = Some("postgres://u@127.0.0.1:1/x");
    for (args, expect) in [
        (
            vec!["run", "--handler", "t=exec:true", "--concurrency", "0"],
            "--concurrency",
        ),
        (
            vec!["run", "--handler", "t=exec:true", "--batch", "5000"],
            "--batch",
        ),
        (
            vec!["run", "--handler", "t=exec:true", "--poll-interval", "soon"],
            "--poll-interval",
        ),
        (vec!["run", "--handler", "t=exec:/no/such/cmd"], "not found"),
        (vec!["run", "--handler", "t=lambda:x"], "unknown kind"),
        (
            vec!["run", "--handler", "t=exec:true", "--queues", ""],
            "--queues",
        ),
        (
            vec![
                "run",
                "--handler",
                "t=exec:true",
                "--metrics-addr",
                "not-an-addr",
            ],
            "--metrics-addr",
        ),
        (vec!["run"], "--handler"),
    ] {
        let o = run(&args, url);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(expect), "{args:?}: {}", stderr(&o));
    }
}

#[tokio::test]
async fn migrate_enqueue_stats_and_dead_work_from_the_command_line() {
    let db = empty_db().await;
    let url = Some(db.url.as_str());
    let o = run(&["migrate"], url);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["migrate"], url);
    assert!(String::from_utf8_lossy(&o.stdout).contains("schema is current"));

    let o = run(
        &[
            "enqueue",
            "--task",
            "mail",
            "--payload",
            r#"{"to":"x@y.z"}"#,
            "--queue",
            "email",
            "--priority",
            "3",
        ],
        url,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let id: i64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    let o = run(&["enqueue", "--task", "later", "--delay", "1h"], url);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(&["enqueue", "--task", "x", "--payload", "{not json"], url);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--payload is not valid JSON"));

    // NDJSON: all lines commit together, or none.
    let ndjson = (0..2500)
        .map(|i| format!(r#"{{"task":"bulk","payload":{{"i":{i}}},"queue":"bulk"}}"#))
        .collect::<Vec<_>>()
        .join("\n");
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["enqueue", "--ndjson"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(ndjson.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("enqueued 2500 jobs"));

    let bad = "{\"task\":\"ok\"}\n{\"task\":\"\"}\n";
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["enqueue", "--ndjson"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bad.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("stdin line 2: task must not be empty"),
        "{}",
        stderr(&o)
    );
    let oks: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE task = 'ok'")
        .await;
    assert_eq!(oks, 0, "nothing of a rejected batch is inserted");

    let o = run(&["stats", "--json"], url);
    assert!(o.status.success(), "{}", stderr(&o));
    let stats: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let by_queue = |q: &str| {
        stats
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["queue"] == q)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_queue("bulk")["ready"], 2500);
    assert_eq!(by_queue("email")["ready"], 1);
    assert_eq!(by_queue("default")["scheduled"], 1);
    let o = run(&["stats"], url);
    assert!(String::from_utf8_lossy(&o.stdout).contains("OLDEST READY"));

    // Dead jobs: list, retry, purge.
    db.client()
        .await
        .batch_execute(&format!(
            "WITH d AS (DELETE FROM pgwake.jobs WHERE id = {id} RETURNING *)
             INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
             SELECT id, queue, task, payload, priority, run_at, 25, 25, 'gave up', created_at FROM d"
        ))
        .await
        .unwrap();
    let o = run(&["dead", "list", "--json"], url);
    let list: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(list[0]["id"], id);
    assert_eq!(list[0]["last_error"], "gave up");
    let o = run(&["dead", "retry"], url);
    assert_eq!(
        o.status.code(),
        Some(2),
        "retry without --id/--all is refused"
    );
    // The id as `job show`, `cancel` and `explain` take it: positional
    // (before, clap refused it as "unexpected argument", naming no fix).
    let o = run(&["dead", "retry", &id.to_string()], url);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("moved 1 dead jobs back"),
        "{}",
        stderr(&o)
    );
    db.client()
        .await
        .batch_execute(&format!(
            "WITH d AS (DELETE FROM pgwake.jobs WHERE id = {id} RETURNING *)
             INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
             SELECT id, queue, task, payload, priority, run_at, 25, 25, 'gave up', created_at FROM d"
        ))
        .await
        .unwrap();
    let o = run(&["dead", "retry", "--id", &id.to_string()], url);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("moved 1 dead jobs back"),
        "{}",
        stderr(&o)
    );
    let o = run(&["dead", "retry", &id.to_string(), "--all"], url);
    assert_eq!(o.status.code(), Some(2), "an id and --all: {}", stderr(&o));
    let attempts: i32 = db
        .scalar(&format!("SELECT attempts FROM pgwake.jobs WHERE id = {id}"))
        .await;
    assert_eq!(attempts, 0);
    let o = run(&["dead", "purge", "--all"], url);
    assert!(String::from_utf8_lossy(&o.stdout).contains("purged 0"));
}

#[tokio::test]
async fn sigterm_lets_in_flight_jobs_finish_claims_nothing_more_and_exits_0() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!(
        "t=exec:sh -c 'touch {d}/$PGWAKE_JOB_ID.started; while [ ! -e {d}/go ]; do sleep 0.02; done; touch {d}/$PGWAKE_JOB_ID.finished'"
    );
    let ids = insert_jobs(&db, "t", 4).await;
    let child = spawn_pgwake_run(
        &db.url,
        &["--handler", &handler, "--concurrency", "2", "--batch", "1"],
    );
    wait_files(dir.path(), ".started", 2).await;
    let mut child = child;
    let log = tail_stderr(&mut child);
    send_signal(&child, libc::SIGTERM);
    // The two running jobs are released only once the signal was handled.
    let l = log.clone();
    eventually("the signal was handled", Duration::from_secs(30), || {
        let l = l.clone();
        async move { l.lock().unwrap().contains("signal received") }
    })
    .await;
    std::fs::write(dir.path().join("go"), "").unwrap();
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", log.lock().unwrap());
    let finished = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".finished")
        })
        .count();
    assert_eq!(finished, 2, "both in-flight jobs finished");
    let left: Vec<(i64, i32)> = db
        .client()
        .await
        .query("SELECT id, attempts FROM pgwake.jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(left.len(), 2, "nothing claimed after the signal: {left:?}");
    assert!(left.iter().all(|(id, a)| ids.contains(id) && *a == 0));
}

#[tokio::test]
async fn a_second_signal_hands_running_jobs_back_without_using_an_attempt() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!("t=exec:sh -c 'touch {d}/$PGWAKE_JOB_ID.started; sleep 3600'");
    let ids = insert_jobs(&db, "t", 2).await;
    let child = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            &handler,
            "--concurrency",
            "2",
            "--batch",
            "1",
            "--grace-period",
            "1h",
        ],
    );
    wait_files(dir.path(), ".started", 2).await;
    send_signal(&child, libc::SIGTERM);
    send_signal(&child, libc::SIGINT);
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let back: Vec<(i64, i32)> = db
        .client()
        .await
        .query("SELECT id, attempts FROM pgwake.jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(back, ids.iter().map(|id| (*id, 0)).collect::<Vec<_>>());
    let pending: i64 = db.scalar("SELECT count(*) FROM pgwake.tx_attempts").await;
    assert_eq!(pending, 0, "no attempt left counted");
}

#[tokio::test]
async fn grace_period_exceeded_hands_jobs_back_and_exits_0() {
    let db = migrated_db().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display();
    let handler = format!("t=exec:sh -c 'touch {d}/$PGWAKE_JOB_ID.started; sleep 3600'");
    let ids = insert_jobs(&db, "t", 1).await;
    let child = spawn_pgwake_run(&db.url, &["--handler", &handler, "--grace-period", "300ms"]);
    wait_files(dir.path(), ".started", 1).await;
    send_signal(&child, libc::SIGTERM);
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stderr(&o).contains("grace period over"), "{}", stderr(&o));
    let attempts: i32 = db
        .scalar(&format!(
            "SELECT attempts FROM pgwake.jobs WHERE id = {}",
            ids[0]
        ))
        .await;
    assert_eq!(attempts, 0);
}

/// `pgwake stats` counted ready, scheduled and dead jobs only: with every
/// job of a queue running in lease mode (or held by a worker that died,
/// until the rescuer moves them back) it said "(no jobs)". Leased jobs are
/// a column of their own, with the expired leases among them.
#[tokio::test]
async fn stats_shows_lease_mode_jobs_in_flight_and_expired_leases() {
    let db = migrated_db().await;
    let url = Some(db.url.as_str());
    let mut worker = spawn_pgwake_run(
        &db.url,
        &[
            "--handler",
            "nap=exec:sleep 600",
            "--lease-duration",
            "1s",
            "--rescue-interval",
            "1h",
        ],
    );
    for _ in 0..2 {
        run(&["enqueue", "--task", "nap", "--queue", "naps"], url);
    }
    eventually("both jobs leased", Duration::from_secs(60), || async {
        db.scalar::<i64>("SELECT count(*) FROM pgwake.leased_jobs")
            .await
            == 2
    })
    .await;
    let leased = || {
        let o = run(&["stats", "--json"], url);
        assert!(o.status.success(), "{}", stderr(&o));
        let stats: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let naps = stats
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["queue"] == "naps")
            .cloned()
            .unwrap_or_else(|| panic!("no line for the queue: {stats}"));
        (naps["leased"].as_i64(), naps["expired_leases"].as_i64())
    };
    assert_eq!(leased(), (Some(2), Some(0)));
    let table = String::from_utf8_lossy(&run(&["stats"], url).stdout).to_string();
    assert!(table.contains("LEASED"), "{table}");
    assert!(!table.contains("(no jobs)"), "{table}");

    // The worker dies; its leases expire and nobody rescues them (the
    // rescuer runs hourly here): still in flight, now expired.
    send_signal(&worker, libc::SIGKILL);
    let _ = worker.wait();
    eventually("both leases expired", Duration::from_secs(60), || async {
        db.scalar::<i64>("SELECT count(*) FROM pgwake.leased_jobs WHERE lease_until < now()")
            .await
            == 2
    })
    .await;
    assert_eq!(leased(), (Some(2), Some(2)));
    let table = String::from_utf8_lossy(&run(&["stats"], url).stdout).to_string();
    assert!(table.contains("2 (2 exp.)"), "{table}");
}

/// A worker whose log reader has gone (a log shipper that died, `pgwake run
/// 2>&1 | head`) still stops on SIGTERM: writing a log line to the broken
/// pipe must not kill the thread that handles the signal (tracing's
/// fallback `eprintln!` panicked on it, so SIGTERM was swallowed and the
/// worker ran on).
#[tokio::test]
async fn sigterm_stops_a_worker_whose_stderr_reader_has_gone() {
    let db = migrated_db().await;
    let mut child = spawn_pgwake_run(&db.url, &["--handler", "t=exec:true"]);
    // It starts (signals handled from then on), then the reader goes away.
    let stderr = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stderr));
    loop {
        let line = lines.next().expect("the worker's log ended").unwrap();
        if line.contains("worker started") {
            break;
        }
    }
    drop(lines);
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, Duration::from_secs(60)).await;
    assert!(
        out.status.code().is_some(),
        "killed, not exited: {:?}",
        out.status
    );
}

/// Found from outside: a payload holding `\u0000` (JSON allows it,
/// PostgreSQL's jsonb does not) failed with the server's "unsupported
/// Unicode escape sequence (SQLSTATE 22P05)" and exit 1, which names no
/// fix. It is refused before the database with the field and the fix,
/// exit 2, and an NDJSON batch with one such line inserts nothing.
#[tokio::test]
async fn a_payload_with_a_nul_character_is_refused_with_the_fix() {
    let db = migrated_db().await;
    let url = Some(db.url.as_str());
    let o = run(
        &[
            "enqueue",
            "--task",
            "t",
            "--payload",
            r#"{"name": "a\u0000b"}"#,
        ],
        url,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("payload holds the character U+0000") && stderr(&o).contains("base64"),
        "{}",
        stderr(&o)
    );
    let lines = "{\"task\":\"ok\"}\n{\"task\":\"t\",\"payload\":{\"k\\u0000\":1}}\n";
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["enqueue", "--ndjson"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("stdin line 2: payload holds the character U+0000"),
        "{}",
        stderr(&o)
    );
    let jobs: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(jobs, 0, "nothing of a rejected batch is inserted");
}

/// A handler's error is often many lines (stderr's tail, a traceback):
/// printed raw, it broke `pgwake dead list` into lines that belong to no
/// column. Each dead job is two lines whatever its error holds, the line
/// breaks folded to ` ⏎ `, a terminal escape escaped, a long error cut.
/// Teeth: printing `last_error` as stored, the listing has 8 lines for the
/// two jobs and the escape reaches the terminal.
#[tokio::test]
async fn dead_list_keeps_one_row_per_job_when_errors_span_lines() {
    let db = migrated_db().await;
    let long = "x".repeat(500);
    db.client()
        .await
        .execute(
            "INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
             VALUES (1, 'default', 'report', '{}', 0, now(), 3, 3, $1, now()),
                    (2, 'default', 'report', '{}', 0, now(), 3, 3, $2, now())",
            &[
                &"Traceback (most recent call last):\r\n  File \"w.py\", line 3\n\u{1b}[31mValueError: boom\n",
                &long,
            ],
        )
        .await
        .unwrap();
    let o = run(&["dead", "list"], Some(&db.url));
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "two lines per dead job: {out}");
    for row in lines.iter().step_by(2) {
        assert!(row.contains("attempts 3/3"), "{out}");
    }
    assert!(
        lines.iter().any(|l| l.ends_with(
            r#"Traceback (most recent call last): ⏎   File "w.py", line 3 ⏎ \u{1b}[31mValueError: boom"#
        )),
        "{out}"
    );
    assert!(!out.contains('\u{1b}'), "a raw escape: {out:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with(&format!("{}…", "x".repeat(200)))),
        "a long error cut at 200 characters: {out}"
    );
}

/// `pgwake ui` has no jobs: its signal line said "finishing running jobs"
/// (the worker's words) and nothing said it had stopped. It says what
/// stops, then "console stopped", and exits 0. Teeth: with
/// `signals::spawn` (the worker's wording) and no closing line, both
/// assertions on the log fail.
#[tokio::test]
async fn pgwake_ui_says_in_its_own_words_that_it_stops_and_stopped() {
    let db = migrated_db().await;
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args(["ui", "--ui-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = tail_stderr(&mut child);
    let l = log.clone();
    eventually("the console serves", Duration::from_secs(30), || {
        let l = l.clone();
        async move { l.lock().unwrap().contains("serving the console") }
    })
    .await;
    send_signal(&child, libc::SIGTERM);
    let o = wait_exit(child, Duration::from_secs(30)).await;
    assert_eq!(o.status.code(), Some(0), "{}", log.lock().unwrap());
    let log = log.lock().unwrap().clone();
    assert!(
        log.contains("signal received: the console stops serving"),
        "{log}"
    );
    assert!(!log.contains("running jobs"), "the worker's words: {log}");
    let last = log.lines().last().unwrap_or_default();
    assert!(
        last.contains("console stopped"),
        "last line {last:?}: {log}"
    );
}

/// `pgwake pressure show | set`: the thresholds can be changed without SQL,
/// a nonsensical set is refused with the range and exit 2 and changes
/// nothing, and `show` prints the level, a held horizon's holder and the
/// thresholds as set.
#[tokio::test]
async fn pressure_thresholds_are_set_from_the_command_line_and_nonsense_is_refused() {
    let db = migrated_db().await;
    let url = Some(db.url.as_str());
    let o = run(
        &[
            "pressure",
            "set",
            "--horizon-elevated",
            "1s",
            "--horizon-critical",
            "1h",
            "--leave-ratio",
            "0.8",
        ],
        url,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let set = |col: &str| format!("SELECT {col}::float8 FROM pgwake.pressure_settings");
    assert_eq!(
        db.scalar::<f64>(&set("horizon_elevated_seconds")).await,
        1.0
    );
    assert_eq!(
        db.scalar::<f64>(&set("horizon_critical_seconds")).await,
        3600.0
    );
    assert_eq!(db.scalar::<f64>(&set("leave_ratio")).await, 0.8);

    // Elevated above critical: refused with the range, nothing changed.
    let o = run(
        &["pressure", "set", "--dead-tuples-elevated", "5000000"],
        url,
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("0 < elevated < critical") && stderr(&o).contains("nothing changed"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        db.scalar::<f64>(&set("dead_tuples_elevated")).await,
        100000.0
    );
    let o = run(&["pressure", "set", "--notify-critical", "2"], url);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let o = run(&["pressure", "set"], url);
    assert_eq!(
        o.status.code(),
        Some(2),
        "no threshold given: a usage error"
    );

    // A session holding the horizon (PostgreSQL itself turns control
    // characters of an application_name into '?').
    let pin = connect_as(&db, "metabase\n\u{1b}[2J").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    let c = db.client().await;
    wait_for(
        "the horizon to be held 1 s",
        Duration::from_secs(60),
        async || {
            let age: f64 = c
                .query_one(
                    "SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)::float8
                 FROM pg_stat_activity WHERE datname = current_database()
                   AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            (age >= 1.5).then_some(()).ok_or(format!("{age} s"))
        },
    )
    .await;
    let o = run(&["pressure", "show"], url);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("level: elevated"), "{out}");
    assert!(out.contains("(metabase"), "the holder: {out}");
    assert!(!out.contains('\u{1b}'), "{out}");
    assert!(
        out.contains("elevated 1s") && out.contains("critical 1h"),
        "{out}"
    );
    let o = run(&["pressure", "show", "--json"], url);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["pressure"]["level"], "elevated");
    assert_eq!(v["thresholds"]["leave_ratio"], 0.8);
    pin.batch_execute("ROLLBACK").await.unwrap();
}

/// Characters that reorder what a terminal shows (a Trojan Source right-to-
/// left override, an isolate): a producer's queue, task, keys, payload and
/// error reach the operator's terminal with them escaped (`\u{202e}`),
/// never raw. Teeth: without the bidi controls in `printable` and the
/// error folding, `jobs list`, `job show`, `stats` and `dead list` print
/// them raw.
#[tokio::test]
async fn bidi_controls_from_producers_never_reach_the_terminal_raw() {
    let db = migrated_db().await;
    let name = "pay\u{202e}fdp.exe\u{2066}x";
    let c = db.client().await;
    let id: i64 = c
        .query_one(
            "SELECT pgwake.enqueue($1, jsonb_build_object('k', $1::text), queue => $1,
                                   ordering_key => $1)",
            &[&name],
        )
        .await
        .unwrap()
        .get(0);
    c.execute(
        "INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, max_attempts, last_error, created_at)
         VALUES ($2::bigint + 1, $1, $1, '{}', 0, now(), 3, 3, $1, now())",
        &[&name, &id],
    )
    .await
    .unwrap();
    // A child with the same task: `job show` of its parent lists it.
    c.execute(
        "SELECT pgwake.enqueue($1, after => ARRAY[$2::int8])",
        &[&name, &id],
    )
    .await
    .unwrap();
    let bidi = |c: char| matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    let id = id.to_string();
    let dead_id = (id.parse::<i64>().unwrap() + 1).to_string();
    for args in [
        vec!["jobs", "list"],
        vec!["job", "show", &id],
        vec!["explain", &id],
        vec!["stats"],
        vec!["dead", "list"],
        vec!["job", "show", &dead_id],
    ] {
        let o = run(&args, Some(&db.url));
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(
            !out.chars().any(bidi),
            "{args:?} prints a bidi control raw: {out:?}"
        );
        assert!(
            out.contains("\\u{202e}"),
            "{args:?} shows the escape: {out}"
        );
    }
}

/// `pgwake signal KEY --payload JSON`: with no job waiting it says the
/// signal is kept (and it is, with its payload); `--keep 0s` keeps nothing;
/// a payload that is not JSON and a key with a control character are
/// refused naming the fix, exit 2 (bad input), before anything is sent.
#[tokio::test]
async fn pgwake_signal_keeps_a_signal_nobody_waits_for_and_refuses_bad_input() {
    let db = migrated_db().await;
    let url = Some(db.url.as_str());
    let o = run(
        &["signal", "payment:42", "--payload", r#"{"paid":true}"#],
        url,
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("kept 1day for the first job"), "{out}");
    let kept: String = db
        .scalar("SELECT key || ' ' || payload::text FROM pgwake.signals")
        .await;
    assert_eq!(kept, r#"payment:42 {"paid": true}"#);
    let o = run(&["signal", "other", "--keep", "0s"], url);
    assert!(String::from_utf8_lossy(&o.stdout).contains("not kept"));
    let o = run(&["signal", "k", "--payload", "not json"], url);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--payload is not JSON"),
        "{}",
        stderr(&o)
    );
    let o = run(&["signal", "a\u{7}b"], url);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("control character"), "{}", stderr(&o));
    let n: i64 = db.scalar("SELECT count(*) FROM pgwake.signals").await;
    assert_eq!(n, 1, "nothing refused was sent");
}

/// `pgwake job show` lists a job's parents and children (issue 36, item
/// 5): each with its task, where it is (done, waiting, held for its own
/// parents) and the edge's policy; a side with more than 50 prints the
/// first 50 and counts the rest; `--json` has both lists.
#[tokio::test]
async fn job_show_lists_parents_and_children_with_their_states_bounded() {
    let db = migrated_db().await;
    let c = db.client().await;
    let ids: String = c
        .query_one(
            r#"SELECT pgwake.flow('[{"name": "a", "task": "fetch_a"},
                                   {"name": "b", "task": "fetch_b"},
                                   {"name": "m", "task": "merge", "after": ["a", "b"]},
                                   {"name": "s", "task": "send", "after": ["m"],
                                    "on_parent_failure": "run"}]')::text"#,
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let ids: serde_json::Value = serde_json::from_str(&ids).unwrap();
    let id = |n: &str| ids[n].as_i64().unwrap();
    c.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&id("a")])
        .await
        .unwrap();
    c.execute(
        "SELECT pgwake.enqueue('fan', after => ARRAY[$1::int8]) FROM generate_series(1, 60)",
        &[&id("b")],
    )
    .await
    .unwrap();
    let show = |job: i64, json: bool| {
        let job = job.to_string();
        let mut args = vec!["job", "show", job.as_str()];
        if json {
            args.push("--json");
        }
        let o = run(&args, Some(&db.url));
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).to_string()
    };
    let out = show(id("m"), false);
    for line in [
        "parents (2)\n".to_string(),
        // ended done and gone, history off: its task is no longer known
        format!("  {}  -  done  on failure cancel, edge done\n", id("a")),
        format!(
            "  {}  fetch_b  waiting  on failure cancel, edge open\n",
            id("b")
        ),
        "children (1)\n".to_string(),
        format!(
            "  {}  send  held for its own parents  on failure run, edge open\n",
            id("s")
        ),
    ] {
        assert!(out.contains(&line), "{line:?} in {out}");
    }
    let out = show(id("b"), false);
    assert!(out.contains("children (61)\n"), "{out}");
    assert!(out.contains("  … and 11 more\n"), "{out}");
    assert!(!out.contains("parents ("), "{out}");
    let json: serde_json::Value = serde_json::from_str(&show(id("m"), true)).unwrap();
    assert_eq!(json["parents"]["total"], 2, "{json}");
    assert_eq!(json["parents"]["shown"][0]["state"], "done", "{json}");
    assert_eq!(json["children"]["shown"][0]["id"], id("s"), "{json}");
}
