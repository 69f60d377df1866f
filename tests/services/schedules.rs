//! Recurring jobs: each tick is enqueued exactly once however many worker
//! processes serve it, including a worker killed with SIGKILL in the middle
//! of a tick and a restart across ticks; catch-up policies after downtime; no
//! pile-up behind a waiting job; schedules no worker can evaluate; metrics.
//!
//! Nothing waits for wall-clock minutes: the process tests use per-second
//! schedules (6 fields) and wait on the tick ledger; the policy tests move
//! `next_tick` back in the database and drive one scheduler round directly.

use crate::common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use pgwake::admin::schedules::{self, CatchUp, NewSchedule};
use pgwake::internal::{RoundReport, Scheduler, SchedulerConfig};

/// How long any awaited condition may take before the test fails.
const DEADLINE: Duration = Duration::from_secs(60);

/// Advisory lock key of the tick gate.
const GATE: i64 = 4242;

/// A ledger of every committed enqueue (an AFTER INSERT trigger on
/// pgwake.jobs, so it commits or rolls back with the enqueue; one row per
/// job id, so a job handed back at shutdown is not a second enqueue; a tick
/// enqueued twice is two job ids with one `run_at`) and a gate:
/// while `gate.armed`, an enqueue waits for the test's advisory lock, which
/// holds a scheduler in the middle of its tick transaction.
async fn create_tick_ledger(db: &TestDb) {
    db.client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE tick_ledger (job_id bigint PRIMARY KEY, task text NOT NULL,
                                       run_at timestamptz NOT NULL,
                                       by_app text NOT NULL DEFAULT current_setting('application_name'),
                                       xid bigint NOT NULL DEFAULT txid_current(),
                                       at timestamptz NOT NULL DEFAULT clock_timestamp());
             CREATE TABLE gate (armed boolean NOT NULL);
             INSERT INTO gate VALUES (false);
             CREATE FUNCTION ledger_tick() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF (SELECT armed FROM gate) THEN
                     PERFORM pg_advisory_xact_lock_shared({GATE});
                 END IF;
                 -- A job handed back at shutdown is re-inserted under its own id:
                 -- not a new enqueue.
                 INSERT INTO tick_ledger (job_id, task, run_at) VALUES (NEW.id, NEW.task, NEW.run_at)
                     ON CONFLICT (job_id) DO NOTHING;
                 RETURN NULL;
             END $$;
             CREATE TRIGGER ledger AFTER INSERT ON pgwake.jobs
                 FOR EACH ROW EXECUTE FUNCTION ledger_tick();"
        ))
        .await
        .unwrap();
}

/// The ticks (run_at) enqueued for `task`, oldest first.
async fn ledger(db: &TestDb, task: &str) -> Vec<DateTime<Utc>> {
    db.client()
        .await
        .query(
            "SELECT run_at FROM tick_ledger WHERE task = $1 ORDER BY run_at",
            &[&task],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn until_ledger(
    db: &TestDb,
    task: &str,
    what: &str,
    cond: impl Fn(&[DateTime<Utc>]) -> bool,
) {
    eventually(what, DEADLINE, || async { cond(&ledger(db, task).await) }).await;
}

/// The exactly-once check for a per-second schedule `name` of task `task`,
/// once no worker runs: no tick enqueued twice, and every tick from the
/// schedule's first to the one before `next_tick` is accounted for: enqueued
/// (in the ledger), missed or skipped as waiting, per the database's own
/// counters. Returns (enqueued, missed, waiting).
async fn check_every_tick_once(db: &TestDb, name: &str, task: &str) -> (i64, i64, i64) {
    let ticks = ledger(db, task).await;
    let mut unique = ticks.clone();
    unique.dedup();
    if unique.len() != ticks.len() {
        let rows: Vec<String> = db
            .client()
            .await
            .query("SELECT format('%s %s %s xid %s at %s', job_id, run_at, by_app, xid, at) FROM tick_ledger WHERE task = $1 ORDER BY at", &[&task])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        panic!("a tick was enqueued twice:\n{}", rows.join("\n"));
    }
    let row = db
        .client()
        .await
        .query_one(
            "SELECT ticks_enqueued, ticks_missed, ticks_waiting,
                    (SELECT count(*) FROM generate_series(
                         date_trunc('second', created_at) + interval '1 second',
                         next_tick - interval '1 second', interval '1 second'))
             FROM pgwake.schedules WHERE name = $1",
            &[&name],
        )
        .await
        .unwrap();
    let (enqueued, missed, waiting, passed): (i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(
        enqueued,
        ticks.len() as i64,
        "the counter agrees with the ledger"
    );
    assert_eq!(
        enqueued + missed + waiting,
        passed,
        "every tick the schedule passed is enqueued, missed or waiting: {ticks:?}"
    );
    for pair in ticks.windows(2) {
        assert!(pair[1] > pair[0]);
    }
    (enqueued, missed, waiting)
}

fn worker(db: &TestDb, name: &str) -> std::process::Child {
    let mut child = spawn_pgwake_run(
        &db.url,
        &["--handler", "*=exec:true", "--application-name", name],
    );
    // Keep the pipe drained.
    let _ = tail_stderr(&mut child);
    child
}

async fn terminate(child: std::process::Child) {
    send_signal(&child, libc::SIGTERM);
    let out = wait_exit(child, DEADLINE).await;
    assert!(out.status.success(), "worker exit: {:?}", out.status);
}

async fn add(db: &TestDb, s: NewSchedule) {
    schedules::add(&db.client().await, &s).await.unwrap();
}

#[tokio::test]
async fn three_workers_enqueue_each_tick_once_even_when_one_is_killed_mid_tick() {
    let db = migrated_db().await;
    create_tick_ledger(&db).await;
    add(
        &db,
        NewSchedule::new("every-second", "* * * * * *", "tick").catch_up(CatchUp::Missed(1000)),
    )
    .await;
    let mut workers: Vec<(String, Option<std::process::Child>)> = ["w1", "w2", "w3"]
        .iter()
        .map(|n| (n.to_string(), Some(worker(&db, n))))
        .collect();
    until_ledger(&db, "tick", "three ticks enqueued", |t| t.len() >= 3).await;

    // Hold the next tick's transaction half-way: its job is inserted, not
    // committed, the schedule row locked.
    let gate = db.client().await;
    gate.execute("SELECT pg_advisory_lock($1)", &[&GATE])
        .await
        .unwrap();
    gate.execute("UPDATE gate SET armed = true", &[])
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let held_by: String = loop {
        let rows = gate
            .query(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                 WHERE l.locktype = 'advisory' AND NOT l.granted AND l.objid = $1",
                &[&(GATE as u32)],
            )
            .await
            .unwrap();
        if let Some(r) = rows.first() {
            break r.get(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no scheduler blocked mid-tick"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let gated_tick: DateTime<Utc> = gate
        .query_one("SELECT next_tick FROM pgwake.schedules", &[])
        .await
        .unwrap()
        .get(0);
    // kill -9 the worker whose scheduler holds the tick.
    let victim = workers
        .iter_mut()
        .find(|(n, _)| *n == held_by)
        .unwrap_or_else(|| panic!("no worker named {held_by:?}"));
    let mut child = victim.1.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    gate.execute("UPDATE gate SET armed = false", &[])
        .await
        .unwrap();
    gate.execute("SELECT pg_advisory_unlock($1)", &[&GATE])
        .await
        .unwrap();

    // The survivors enqueue the held tick (once) and carry on.
    until_ledger(&db, "tick", "the held tick and three more", |t| {
        t.contains(&gated_tick) && t.iter().filter(|x| **x > gated_tick).count() >= 3
    })
    .await;
    for (_, child) in workers {
        if let Some(child) = child {
            terminate(child).await;
        }
    }
    let ticks = ledger(&db, "tick").await;
    assert_eq!(
        ticks.iter().filter(|t| **t == gated_tick).count(),
        1,
        "the tick the killed worker held is enqueued exactly once"
    );
    let (enqueued, missed, _) = check_every_tick_once(&db, "every-second", "tick").await;
    assert_eq!(missed, 0, "catch-up 1000 misses nothing");
    assert!(enqueued >= 7);
}

#[tokio::test]
async fn a_restart_across_ticks_enqueues_the_ticks_it_missed_once_per_policy() {
    let db = migrated_db().await;
    create_tick_ledger(&db).await;
    add(
        &db,
        NewSchedule::new("all", "* * * * * *", "all").catch_up(CatchUp::Missed(1000)),
    )
    .await;
    add(&db, NewSchedule::new("skip", "* * * * * *", "skip")).await;
    let w1 = worker(&db, "w1");
    let w2 = worker(&db, "w2");
    for task in ["all", "skip"] {
        until_ledger(&db, task, "two ticks enqueued", |t| t.len() >= 2).await;
    }
    terminate(w1).await;
    terminate(w2).await;
    // In production the next workers would run what the stopped ones left;
    // clear it so the pile-up rule (tested on its own below) stays out of
    // this test.
    db.client()
        .await
        .execute("DELETE FROM pgwake.jobs", &[])
        .await
        .unwrap();

    // Down until at least two more ticks of each schedule are due.
    let client = db.client().await;
    let resume: DateTime<Utc> = client
        .query_one("SELECT max(next_tick) FROM pgwake.schedules", &[])
        .await
        .unwrap()
        .get(0);
    eventually("two ticks pass while no worker runs", DEADLINE, || async {
        client
            .query_one(
                "SELECT now() > $1::timestamptz + interval '1 second'",
                &[&resume],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
    let before_skip = ledger(&db, "skip").await.len();

    let w3 = worker(&db, "w3");
    for task in ["all", "skip"] {
        until_ledger(&db, task, "ticks after the restart", |t| {
            t.iter()
                .filter(|x| **x > resume + chrono::Duration::seconds(1))
                .count()
                >= 2
        })
        .await;
    }
    terminate(w3).await;

    let (_, missed, _) = check_every_tick_once(&db, "all", "all").await;
    assert_eq!(
        missed, 0,
        "catch-up 1000 enqueues every tick of the downtime"
    );
    let all = ledger(&db, "all").await;
    assert!(all.contains(&resume) && all.contains(&(resume + chrono::Duration::seconds(1))));

    let (_, missed, _) = check_every_tick_once(&db, "skip", "skip").await;
    assert!(missed >= 1, "skip drops the older ticks of the downtime");
    let skip = ledger(&db, "skip").await;
    let first_after = skip[before_skip];
    assert!(
        first_after > resume,
        "skip resumes with the latest due tick, not the first missed one"
    );
}

/// A scheduler driven one round at a time.
fn scheduler(db: &TestDb) -> Scheduler {
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    Scheduler::new(pool, SchedulerConfig::default())
}

/// Pretend every worker was down for `hours` hours: the schedule's next
/// tick goes back that far (an hourly schedule). Returns that tick.
async fn down_for_hours(db: &TestDb, name: &str, hours: i32) -> DateTime<Utc> {
    db.client()
        .await
        .query_one(
            "UPDATE pgwake.schedules SET fresh = false,
                 next_tick = date_trunc('hour', now()) - make_interval(hours => $2)
             WHERE name = $1 RETURNING next_tick",
            &[&name, &hours],
        )
        .await
        .unwrap()
        .get(0)
}

async fn job_ticks(db: &TestDb, task: &str) -> Vec<DateTime<Utc>> {
    db.client()
        .await
        .query(
            "SELECT run_at FROM pgwake.jobs WHERE task = $1 ORDER BY run_at",
            &[&task],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn skip_enqueues_only_the_latest_due_tick_after_downtime_and_counts_the_missed_ones() {
    let db = migrated_db().await;
    add(&db, NewSchedule::new("hourly", "0 * * * *", "report")).await;
    let s = scheduler(&db);
    let first = s.run_once().await.unwrap();
    assert_eq!(first.enqueued, 0, "a new schedule waits for its first tick");
    let from = down_for_hours(&db, "hourly", 10).await;

    let r = s.run_once().await.unwrap();
    let ticks = job_ticks(&db, "report").await;
    assert_eq!(ticks.len(), 1, "{ticks:?}");
    assert_eq!(r.enqueued, 1);
    let latest = ticks[0];
    assert_eq!(
        r.missed as i64,
        (latest - from).num_hours(),
        "every tick from {from} up to the latest one ({latest}) is missed"
    );
    assert!(r.missed >= 10);
    let again = s.run_once().await.unwrap();
    assert_eq!(again, RoundReport::default(), "the tick is not due twice");
    let info = &schedules::list(&db.client().await).await.unwrap()[0];
    assert_eq!(info.ticks_missed as u64, r.missed);
    assert_eq!(info.last_tick, Some(latest));
    assert_eq!(info.next_tick, Some(latest + chrono::Duration::hours(1)));
}

#[tokio::test]
async fn catch_up_n_enqueues_the_n_newest_missed_ticks_and_the_latest_one() {
    let db = migrated_db().await;
    add(
        &db,
        NewSchedule::new("hourly", "0 * * * *", "report").catch_up(CatchUp::Missed(3)),
    )
    .await;
    let s = scheduler(&db);
    let from = down_for_hours(&db, "hourly", 10).await;
    let r = s.run_once().await.unwrap();
    let ticks = job_ticks(&db, "report").await;
    assert_eq!(ticks.len(), 4, "3 missed ticks and the latest: {ticks:?}");
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1] - pair[0],
            chrono::Duration::hours(1),
            "consecutive ticks"
        );
    }
    assert_eq!(
        r.missed as i64,
        (ticks[0] - from).num_hours(),
        "older ones are missed"
    );
    assert_eq!(s.run_once().await.unwrap().enqueued, 0);
}

#[tokio::test]
async fn a_tick_whose_previous_job_still_waits_is_skipped_and_counted_but_a_running_one_does_not_block(
) {
    let db = migrated_db().await;
    add(&db, NewSchedule::new("hourly", "0 * * * *", "report")).await;
    let s = scheduler(&db);
    down_for_hours(&db, "hourly", 1).await;
    assert_eq!(s.run_once().await.unwrap().enqueued, 1);

    // Nobody claimed that job: the next tick is skipped, not piled up.
    down_for_hours(&db, "hourly", 1).await;
    let r = s.run_once().await.unwrap();
    assert_eq!((r.enqueued, r.waiting), (0, 1));
    assert_eq!(job_ticks(&db, "report").await.len(), 1);

    // A claim holds the job (running in tx mode): the tick is enqueued.
    let mut claimer = db.client().await;
    let claim = claimer.transaction().await.unwrap();
    claim
        .execute("DELETE FROM pgwake.jobs WHERE task = 'report'", &[])
        .await
        .unwrap();
    down_for_hours(&db, "hourly", 1).await;
    assert_eq!(s.run_once().await.unwrap().enqueued, 1);
    claim.commit().await.unwrap();
    assert_eq!(
        job_ticks(&db, "report").await.len(),
        1,
        "the new tick's job"
    );
    let info = &schedules::list(&db.client().await).await.unwrap()[0];
    assert_eq!((info.ticks_enqueued, info.ticks_waiting), (2, 1));
}

#[tokio::test]
async fn a_schedule_no_worker_can_evaluate_is_marked_invalid_and_not_served() {
    let db = migrated_db().await;
    // Well-formed, so the SQL API accepts it; 30 February never comes.
    db.client()
        .await
        .execute(
            "SELECT pgwake.schedule_add('never', '0 0 30 2 *', 't')",
            &[],
        )
        .await
        .unwrap();
    let s = scheduler(&db);
    let r = s.run_once().await.unwrap();
    assert_eq!((r.claimed, r.invalid), (1, 1));
    let info = &schedules::list(&db.client().await).await.unwrap()[0];
    assert!(
        info.error.as_deref().unwrap().contains("never matches"),
        "{info:?}"
    );
    assert_eq!(info.next_tick, None);
    assert_eq!(s.run_once().await.unwrap().claimed, 0, "not claimed again");
}

#[tokio::test]
async fn the_sql_api_validates_every_argument_and_names_it() {
    let db = migrated_db().await;
    let c = db.client().await;
    for (call, field) in [
        ("pgwake.schedule_add('', '* * * * *', 't')", "name"),
        ("pgwake.schedule_add('a', '61 * * * *', 't')", "cron"),
        ("pgwake.schedule_add('a', '* * * *', 't')", "cron"),
        ("pgwake.schedule_add('a', '* * * * *', '')", "task"),
        (
            "pgwake.schedule_add('a', '* * * * *', 't', queue => '')",
            "queue",
        ),
        (
            "pgwake.schedule_add('a', '* * * * *', 't', tz => 'Mars/Base')",
            "tz",
        ),
        (
            "pgwake.schedule_add('a', '* * * * *', 't', catch_up => 'all')",
            "catch_up",
        ),
    ] {
        let e = c.execute(&format!("SELECT {call}"), &[]).await.unwrap_err();
        let db_error = e.as_db_error().unwrap();
        assert_eq!(db_error.code().code(), "22023", "{call}");
        assert!(
            db_error.message().starts_with(&format!("{field}: ")),
            "{call}: {}",
            db_error.message()
        );
    }
    c.execute(
        "SELECT pgwake.schedule_add('a', '0 9 * * MON-FRI', 't', tz => 'Europe/Berlin')",
        &[],
    )
    .await
    .unwrap();
    let e = c
        .execute("SELECT pgwake.schedule_add('a', '* * * * *', 't')", &[])
        .await
        .unwrap_err();
    assert_eq!(e.code().unwrap().code(), "23505");
    let n: i64 = c
        .query_one(
            "SELECT count(*) FROM pgwake.schedule_list WHERE catch_up = 'skip'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let removed: bool = c
        .query_one("SELECT pgwake.schedule_remove('a')", &[])
        .await
        .unwrap()
        .get(0);
    assert!(removed);
}

#[tokio::test]
async fn the_cli_refuses_bad_definitions_with_exit_2_naming_the_flag() {
    let db = migrated_db().await;
    let base = ["schedule", "add", "--name", "n", "--task", "t"];
    for (extra, flag) in [
        (&["--cron", "* * *"][..], "--cron"),
        (&["--cron", "0 0 30 2 *"][..], "--cron"),
        (&["--cron", "* * * * *", "--tz", "Mars/Base"][..], "--tz"),
        (
            &["--cron", "* * * * *", "--payload", "{nope"][..],
            "--payload",
        ),
        (
            &["--cron", "* * * * *", "--catch-up", "0"][..],
            "--catch-up",
        ),
        (
            &["--cron", "* * * * *", "--priority", "high"][..],
            "--priority",
        ),
        (&["--cron", "* * * * *", "--queue", ""][..], "--queue"),
    ] {
        let out = pgwake_cmd()
            .env("DATABASE_URL", &db.url)
            .args(base)
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {stderr}");
        assert!(
            stderr.contains(flag),
            "{extra:?} must name {flag}: {stderr}"
        );
    }
    let out = pgwake_cmd()
        .env("DATABASE_URL", &db.url)
        .args([
            "schedule",
            "add",
            "--name",
            "",
            "--cron",
            "* * * * *",
            "--task",
            "t",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--name"));

    // Good input, then a taken name and an unknown one: exit 1, said so.
    let run = |args: &[&str]| {
        pgwake_cmd()
            .env("DATABASE_URL", &db.url)
            .args(args)
            .output()
            .unwrap()
    };
    let ok = run(&[
        "schedule",
        "add",
        "--name",
        "n",
        "--cron",
        "*/5 * * * *",
        "--task",
        "t",
        "--tz",
        "Europe/Berlin",
        "--catch-up",
        "3",
        "--payload",
        r#"{"a":1}"#,
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("next ticks"));
    let taken = run(&[
        "schedule",
        "add",
        "--name",
        "n",
        "--cron",
        "* * * * *",
        "--task",
        "t",
    ]);
    assert_eq!(taken.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&taken.stderr).contains("already exists"));
    let replaced = run(&[
        "schedule",
        "add",
        "--name",
        "n",
        "--cron",
        "0 * * * *",
        "--task",
        "u",
        "--replace",
    ]);
    assert!(replaced.status.success());
    let list = run(&["schedule", "list", "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    assert_eq!(all[0]["cron"], "0 * * * *");
    assert_eq!(all[0]["task"], "u");
    assert_eq!(all[0]["catch_up"], "skip");
    assert!(run(&["schedule", "remove", "n"]).status.success());
    let gone = run(&["schedule", "remove", "n"]);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no schedule named"));
    let empty = run(&["schedule", "list"]);
    assert_eq!(String::from_utf8_lossy(&empty.stdout), "no schedules\n");
}

#[tokio::test]
async fn ticks_schedules_and_lateness_are_in_the_metrics() {
    let handle = pgwake::metrics::install();
    let db = migrated_db().await;
    add(&db, NewSchedule::new("metered", "0 * * * *", "report")).await;
    down_for_hours(&db, "metered", 3).await;
    let stop = tokio_util::sync::CancellationToken::new();
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let task = tokio::spawn(Scheduler::new(pool, SchedulerConfig::default()).run(stop.clone()));
    let wanted = [
        r#"pgwake_schedule_ticks_total{schedule="metered",result="enqueued"} 1"#,
        r#"pgwake_schedule_ticks_total{schedule="metered",result="missed"}"#,
        r#"pgwake_schedules{state="active"} 1"#,
    ];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    let text = loop {
        let text = handle.render();
        if wanted.iter().all(|w| text.contains(w)) {
            break text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "schedule metrics missing:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.cancel();
    task.await.unwrap();
    for name in [
        "pgwake_schedule_tick_delay_seconds_count",
        "pgwake_schedule_overdue_seconds",
        r#"pgwake_schedules{state="invalid"}"#,
        "pgwake_scheduler_errors_total",
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
}

#[tokio::test]
async fn a_schedule_whose_job_cannot_be_inserted_stays_due_without_holding_back_the_others() {
    let db = migrated_db().await;
    db.client()
        .await
        .batch_execute(
            "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'poison refused'; END $$;
             CREATE TRIGGER refuse_poison BEFORE INSERT ON pgwake.jobs
                 FOR EACH ROW WHEN (NEW.task = 'poison') EXECUTE FUNCTION refuse_poison();",
        )
        .await
        .unwrap();
    add(&db, NewSchedule::new("good", "0 * * * *", "report")).await;
    add(&db, NewSchedule::new("bad", "0 * * * *", "poison")).await;
    down_for_hours(&db, "good", 1).await;
    let stuck = down_for_hours(&db, "bad", 1).await;
    let r = scheduler(&db).run_once().await.unwrap();
    assert_eq!((r.claimed, r.enqueued, r.failed), (2, 1, 1));
    assert_eq!(
        job_ticks(&db, "report").await.len(),
        1,
        "the good schedule is served"
    );
    let all = schedules::list(&db.client().await).await.unwrap();
    let bad = all.iter().find(|s| s.name == "bad").unwrap();
    assert_eq!(
        bad.next_tick,
        Some(stuck),
        "the bad one stays due, retried next round"
    );
    assert_eq!(bad.ticks_enqueued, 0);
}

/// A disabled schedule is kept but not served: its due ticks enqueue
/// nothing. Enabled again, it starts from its first tick after that moment:
/// the ticks of the disabled time are neither enqueued nor counted missed.
#[tokio::test]
async fn a_disabled_schedule_is_not_served_and_enabled_again_starts_from_now() {
    let db = migrated_db().await;
    let client = db.client().await;
    add(&db, NewSchedule::new("every second", "* * * * * *", "tick")).await;
    // Served before, and ten seconds of ticks due.
    client
        .batch_execute(
            "UPDATE pgwake.schedules SET fresh = false, next_tick = now() - interval '10 seconds'",
        )
        .await
        .unwrap();
    let out = run_pgwake(&["schedule", "disable", "every second"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let scheduler = Scheduler::new(pool, SchedulerConfig::default());
    let round = scheduler.run_once().await.unwrap();
    assert_eq!(
        round,
        RoundReport::default(),
        "a disabled schedule is not served"
    );
    assert_eq!(remaining(&db).await, 0);
    let listed = run_pgwake(&["schedule", "list", "--json"], Some(&db.url));
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed[0]["enabled"], false);

    let out = run_pgwake(&["schedule", "enable", "every second"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    wait_for(
        "a tick after the schedule is enabled",
        Duration::from_secs(30),
        async || {
            scheduler.run_once().await.map_err(|e| e.to_string())?;
            match remaining(&db).await {
                0 => Err("no tick yet".to_string()),
                n => Ok(n),
            }
        },
    )
    .await;
    let (enqueued, missed): (i64, i64) = {
        let r = client
            .query_one(
                "SELECT ticks_enqueued, ticks_missed FROM pgwake.schedules",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(missed, 0, "the disabled time is not caught up");
    assert!((1..=2).contains(&enqueued), "{enqueued}");
    // An unknown name is refused.
    let out = run_pgwake(&["schedule", "disable", "nope"], Some(&db.url));
    assert!(!out.status.success());
    assert!(stderr_of(&out).contains("nope"), "{}", stderr_of(&out));
}
