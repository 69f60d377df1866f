//! History and results (issue #11 §3, §4): finished jobs in
//! `pgwake.finished_jobs` with their outcome and result, in both delivery
//! modes; retention by whole partitions; `pgwake history`; SQL handlers that
//! see the job's id and attempt; history off records nothing.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::config::{HistoryConfig, KeepFinished};
use pgwake::internal::Maintenance;
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome, Worker, WorkerConfig};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The test config with history on (kept a week).
fn history_config() -> WorkerConfig {
    WorkerConfig {
        history: HistoryConfig::keeping(KeepFinished::Keep(Duration::from_secs(7 * 86400))),
        lease_queues: vec!["lq".into()],
        ..test_config()
    }
}

/// A Rust handler: `{"fail": true}` fails for good, `{"boom": n}` retries
/// until attempt n, anything else is done with `{"echo": payload,
/// "attempt": n}`.
struct Echo;

#[async_trait]
impl Handler for Echo {
    async fn handle(&self, job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        if job.payload["fail"] == json!(true) {
            return Ok(Outcome::fail("told to fail"));
        }
        if let Some(raw) = job.payload["raw_result"].as_str() {
            // A result JSON allows and PostgreSQL's jsonb does not hold.
            return Ok(Outcome::done_with(
                serde_json::from_str::<serde_json::Value>(raw)?,
            ));
        }
        Ok(Outcome::done_with(
            json!({"echo": job.payload, "attempt": job.attempt}),
        ))
    }
}

fn worker(db: &TestDb, config: WorkerConfig, flags: &[(&str, usize)]) -> Worker {
    let mut b = Worker::builder(db.config())
        .config(config)
        .handler("echo", Echo);
    for (flag, max) in flags {
        let (task, h) = pgwake::handlers::parse_flag_with(flag, *max).unwrap();
        b = b.handler_arc(&task, h);
    }
    b.build().unwrap()
}

/// `(outcome, result, error, attempts, worker is set, started_at is set)`
/// of job `id`'s history rows, oldest first.
type HistoryRow = (
    String,
    Option<serde_json::Value>,
    Option<String>,
    i32,
    bool,
    bool,
);

async fn history_of(client: &tokio_postgres::Client, id: i64) -> Vec<HistoryRow> {
    client
        .query(
            "SELECT outcome, result, error, attempts, worker IS NOT NULL, started_at IS NOT NULL \
             FROM pgwake.finished_jobs WHERE id = $1 ORDER BY finished_at",
            &[&id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

#[tokio::test]
async fn rust_results_and_deaths_are_recorded_in_both_modes() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for queue in ["default", "lq"] {
        let done = enqueue(&client, &NewJob::new("echo", json!({"n": 1})).queue(queue))
            .await
            .unwrap();
        let dead = enqueue(
            &client,
            &NewJob::new("echo", json!({"fail": true})).queue(queue),
        )
        .await
        .unwrap();
        let unknown = enqueue(&client, &NewJob::new("nobody", json!({})).queue(queue))
            .await
            .unwrap();
        ids.push((queue, done, dead, unknown));
    }
    let mut w = Running::start(worker(&db, history_config(), &[]));
    w.next_events(4, WAIT, |_| true).await;
    w.shutdown().await;
    for (queue, done, dead, unknown) in ids {
        let rows = history_of(&client, done).await;
        assert_eq!(
            rows,
            vec![(
                "done".into(),
                Some(json!({"echo": {"n": 1}, "attempt": 1})),
                None,
                1,
                true,
                true
            )],
            "{queue}"
        );
        let rows = history_of(&client, dead).await;
        assert_eq!(rows.len(), 1, "{queue}: {rows:?}");
        assert_eq!(rows[0].0, "dead");
        assert_eq!(rows[0].1, None);
        assert_eq!(rows[0].2.as_deref(), Some("told to fail"), "{queue}");
        assert!(rows[0].4 && rows[0].5, "{queue}: worker and started_at");
        // A task without a handler is not claimed: no history, still waiting.
        assert_eq!(history_of(&client, unknown).await, vec![], "{queue}");
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pgwake.jobs WHERE id = $1",
                &[&unknown],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(waiting, 1, "{queue}");
    }
}

/// A done job whose result the database cannot store (a number beyond
/// jsonb's numeric range) is done once, recorded without the result, in
/// both modes: never run again, never reported as a lost lease.
#[tokio::test]
async fn a_result_the_database_rejects_never_reruns_a_done_job() {
    let db = migrated_db().await;
    let client = db.client().await;
    let mut ids = Vec::new();
    for queue in ["default", "lq"] {
        for payload in [json!({"raw_result": "1e200000"}), json!({"n": 2})] {
            ids.push(
                enqueue(&client, &NewJob::new("echo", payload).queue(queue))
                    .await
                    .unwrap(),
            );
        }
    }
    let mut w = Running::start(worker(&db, history_config(), &[]));
    let events = w.next_events(4, WAIT, |_| true).await;
    for e in &events {
        assert_eq!(e.resolution, pgwake::Resolution::Done, "{e:?}");
    }
    w.shutdown().await;
    let left: i64 = db
        .scalar(
            "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)",
        )
        .await;
    assert_eq!(left, 0, "nothing runs again");
    for (i, id) in ids.iter().enumerate() {
        let rows = history_of(&client, *id).await;
        assert_eq!(rows.len(), 1, "job {id}: {rows:?}");
        assert_eq!(rows[0].0, "done");
        assert_eq!(rows[0].3, 1, "one attempt");
        if i % 2 == 0 {
            assert_eq!(rows[0].1, None, "recorded without the result");
        } else {
            // Its flush-mate keeps its result.
            assert_eq!(rows[0].1, Some(json!({"echo": {"n": 2}, "attempt": 1})));
        }
    }
}

#[tokio::test]
async fn a_cancelled_job_is_recorded_as_cancelled() {
    // The cancel path moves the job to dead_jobs with last_error
    // 'cancelled'; the trigger on dead_jobs records it as such.
    let db = migrated_db().await;
    let client = db.client().await;
    pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(86400)))
        .await
        .unwrap();
    let id = enqueue(&client, &NewJob::new("t", json!({"x": 1})))
        .await
        .unwrap();
    client
        .batch_execute(&format!(
            "WITH j AS (DELETE FROM pgwake.jobs WHERE id = {id} RETURNING *) \
             INSERT INTO pgwake.dead_jobs (id, queue, task, payload, priority, run_at, attempts, \
                 max_attempts, last_error, created_at) \
             SELECT id, queue, task, payload, priority, run_at, attempts, max_attempts, \
                 'cancelled', created_at FROM j"
        ))
        .await
        .unwrap();
    let rows = history_of(&client, id).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].0, "cancelled");
}

#[tokio::test]
async fn exec_stdout_is_the_result_json_as_json_text_as_a_string_and_bounded() {
    let db = migrated_db().await;
    let client = db.client().await;
    let json_id = enqueue(&client, &NewJob::new("json", json!({})))
        .await
        .unwrap();
    let text_id = enqueue(&client, &NewJob::new("text", json!({})))
        .await
        .unwrap();
    let long_id = enqueue(&client, &NewJob::new("long", json!({})))
        .await
        .unwrap();
    let quiet_id = enqueue(&client, &NewJob::new("quiet", json!({})))
        .await
        .unwrap();
    let flags = [
        (
            r#"json=exec:sh -c 'echo "{\"rows\": 12345678901234567890}"'"#,
            1024,
        ),
        ("text=exec:sh -c 'echo hello world'", 1024),
        // 100 KiB of output, 64 bytes kept: the command is never blocked.
        (
            "long=exec:sh -c 'head -c 102400 /dev/zero | tr \"\\0\" x'",
            64,
        ),
        ("quiet=exec:true", 1024),
    ];
    let mut w = Running::start(worker(&db, history_config(), &flags));
    let ev = w.next_events(4, WAIT, |_| true).await;
    w.shutdown().await;
    assert!(ev.iter().all(|e| e.outcome() == "done"), "{ev:?}");
    let result = |id: i64| {
        let client = &client;
        async move {
            let text: Option<String> = client
                .query_one(
                    "SELECT result::text FROM pgwake.finished_jobs WHERE id = $1",
                    &[&id],
                )
                .await
                .unwrap()
                .get(0);
            text
        }
    };
    assert_eq!(
        result(json_id).await.as_deref(),
        Some(r#"{"rows": 12345678901234567890}"#)
    );
    assert_eq!(result(text_id).await.as_deref(), Some(r#""hello world""#));
    let long = result(long_id).await.unwrap();
    assert_eq!(long, format!("\"{}…[cut]\"", "x".repeat(64)));
    assert_eq!(result(quiet_id).await, None);
}

#[tokio::test]
async fn sql_handlers_see_id_and_attempt_and_return_the_result() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE seen (job_id bigint, attempt int, payload jsonb);
             -- positional (payload, job_id, attempt); fails its first attempt
             CREATE FUNCTION keyed(p jsonb, id bigint, att int) RETURNS jsonb LANGUAGE plpgsql AS $$
             BEGIN
                 IF att = 1 THEN RAISE EXCEPTION 'first attempt fails'; END IF;
                 INSERT INTO seen VALUES (id, att, p);
                 RETURN jsonb_build_object('job', id, 'attempt', att);
             END $$;
             -- named, in another order
             CREATE FUNCTION named(attempt int, payload jsonb, job_id bigint) RETURNS text
             LANGUAGE sql AS $$ INSERT INTO seen VALUES (job_id, attempt, payload) RETURNING 'ok ' || job_id $$;
             -- payload only, returning nothing
             CREATE FUNCTION plain(payload jsonb) RETURNS void LANGUAGE sql AS $$ SELECT $$;",
        )
        .await
        .unwrap();
    let keyed = enqueue(&client, &NewJob::new("keyed", json!({"k": 1})))
        .await
        .unwrap();
    let named: Vec<i64> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(
                enqueue(&client, &NewJob::new("named", json!({"i": i})))
                    .await
                    .unwrap(),
            );
        }
        v
    };
    let plain = enqueue(&client, &NewJob::new("plain", json!({})))
        .await
        .unwrap();
    let flags = [
        ("keyed=sql:keyed", 1024),
        ("named=sql:named", 1024),
        ("plain=sql:plain", 1024),
    ];
    let mut w = Running::start(worker(&db, history_config(), &flags));
    w.next_events(5, WAIT, |e| e.outcome() == "done").await;
    w.shutdown().await;

    let rows = client
        .query("SELECT job_id, attempt FROM seen ORDER BY job_id", &[])
        .await
        .unwrap();
    let seen: Vec<(i64, i32)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut expected = vec![(keyed, 2)];
    expected.extend(named.iter().map(|id| (*id, 1)));
    expected.sort();
    assert_eq!(
        seen, expected,
        "the functions saw each job's id and attempt"
    );

    let rows = history_of(&client, keyed).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, Some(json!({"job": keyed, "attempt": 2})));
    assert_eq!(rows[0].3, 2);
    for id in named {
        let rows = history_of(&client, id).await;
        assert_eq!(rows[0].1, Some(json!(format!("ok {id}"))));
    }
    assert_eq!(history_of(&client, plain).await[0].1, None);
}

#[tokio::test]
async fn a_tx_result_commits_with_its_job_and_a_failed_commit_leaves_neither() {
    let db = migrated_db().await;
    let client = db.client().await;
    // The first claim transaction that wrote to `effects` fails at COMMIT
    // (a deferred constraint trigger): its job removal, its effect and its
    // history row must all be gone; the rerun commits all three.
    client
        .batch_execute(
            "CREATE TABLE effects (job_id bigint);
             CREATE SEQUENCE commits;
             CREATE FUNCTION fail_first_commit() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF nextval('commits') = 1 THEN RAISE EXCEPTION 'commit refused once'; END IF;
                 RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER once AFTER INSERT ON effects
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION fail_first_commit();
             CREATE FUNCTION effect(payload jsonb, job_id bigint, attempt int) RETURNS jsonb
             LANGUAGE sql AS $$ INSERT INTO effects VALUES (job_id) RETURNING jsonb_build_object('attempt', attempt) $$;",
        )
        .await
        .unwrap();
    let id = enqueue(&client, &NewJob::new("effect", json!({})))
        .await
        .unwrap();
    let mut w = Running::start(worker(&db, history_config(), &[("effect=sql:effect", 64)]));
    let ev = w
        .next_events(1, WAIT, |e| e.id == id && e.outcome() == "done")
        .await;
    w.shutdown().await;
    let effects: i64 = db.scalar("SELECT count(*) FROM effects").await;
    assert_eq!(effects, 1, "the failed commit's effect is gone");
    let rows = history_of(&client, id).await;
    assert_eq!(
        rows.len(),
        1,
        "only the committed run is in the history: {rows:?}"
    );
    assert_eq!(rows[0].1, Some(json!({"attempt": ev[0].attempt})));
    assert_eq!(remaining(&db).await, 0);
}

#[tokio::test]
async fn retention_drops_expired_partitions_whole_and_keeps_recent_rows() {
    let db = migrated_db().await;
    let client = db.client().await;
    pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(7 * 86400)))
        .await
        .unwrap();
    // A partition ten days old (as if history had been on then), with rows.
    client
        .batch_execute(
            "SELECT pgwake.history_partition((now() AT TIME ZONE 'UTC')::date - 10);
             SELECT pgwake.history_partition((now() AT TIME ZONE 'UTC')::date);
             INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, attempts, enqueued_at, finished_at)
             SELECT g, 'q', 'old', '{}', 'done', 1, now() - interval '10 days', now() - interval '10 days'
             FROM generate_series(1, 500) g;
             INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, attempts, enqueued_at, finished_at)
             SELECT g, 'q', 'new', '{}', 'done', 1, now(), now() FROM generate_series(501, 510) g;
             -- a stray old row in the default partition (partitions were missing)
             INSERT INTO pgwake.finished_jobs_default (id, queue, task, payload, outcome, attempts, enqueued_at, finished_at)
             VALUES (999, 'q', 'stray', '{}', 'dead', 1, now() - interval '30 days', now() - interval '30 days');",
        )
        .await
        .unwrap();
    let old = format!(
        "pgwake.finished_jobs_{}",
        db.scalar::<String>("SELECT to_char((now() AT TIME ZONE 'UTC')::date - 10, 'YYYYMMDD')")
            .await
    );
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let report = Maintenance::new(pool, HistoryConfig::default())
        .run_once()
        .await
        .unwrap();
    assert!(report.maintained, "{report:?}");
    assert_eq!(report.dropped, 1, "{report:?}");
    assert_eq!(report.rows_dropped, 501, "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    // Today and two days ahead exist (today's was there already).
    assert_eq!(report.created, 2, "{report:?}");
    let gone: bool = client
        .query_one("SELECT to_regclass($1) IS NULL", &[&old])
        .await
        .unwrap()
        .get(0);
    assert!(gone, "{old} was dropped");
    let left: Vec<String> = client
        .query(
            "SELECT DISTINCT task FROM pgwake.finished_jobs ORDER BY task",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(left, vec!["new".to_string()]);
    let recent: i64 = db
        .scalar("SELECT count(*) FROM pgwake.finished_jobs WHERE task = 'new'")
        .await;
    assert_eq!(recent, 10);
}

#[tokio::test]
async fn rows_written_before_their_partition_existed_move_into_it() {
    // History just turned on: no daily partition yet, rows land in the
    // default partition; creating today's partition takes them along.
    let db = migrated_db().await;
    let client = db.client().await;
    pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(86400)))
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, attempts, enqueued_at)
             SELECT g, 'q', 't', '{}', 'done', 1, now() FROM generate_series(1, 5) g",
        )
        .await
        .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 1).unwrap();
    let report = Maintenance::new(pool, HistoryConfig::default())
        .run_once()
        .await
        .unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(report.created, 3, "{report:?}");
    let homes: Vec<String> = client
        .query(
            "SELECT DISTINCT tableoid::regclass::text FROM pgwake.finished_jobs",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let today: String = db
        .scalar("SELECT 'pgwake.finished_jobs_' || to_char((now() AT TIME ZONE 'UTC')::date, 'YYYYMMDD')")
        .await;
    assert_eq!(homes, vec![today]);
    let n: i64 = db.scalar("SELECT count(*) FROM pgwake.finished_jobs").await;
    assert_eq!(n, 5);
}

#[tokio::test]
async fn maintenance_of_many_workers_at_once_creates_each_partition_once() {
    let db = migrated_db().await;
    let client = db.client().await;
    pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(86400)))
        .await
        .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 8).unwrap();
    let rounds: Vec<_> = (0..6)
        .map(|_| {
            let m = Maintenance::new(pool.clone(), HistoryConfig::default());
            tokio::spawn(async move { m.run_once().await })
        })
        .collect();
    let mut created = 0;
    for r in rounds {
        let report = r.await.unwrap().unwrap();
        assert!(report.failed.is_empty(), "{report:?}");
        created += report.created;
    }
    assert_eq!(created, 3, "today and two ahead, each created once");
}

#[tokio::test]
async fn history_off_records_nothing() {
    let db = migrated_db().await;
    let client = db.client().await;
    for queue in ["default", "lq"] {
        enqueue(&client, &NewJob::new("echo", json!({})).queue(queue))
            .await
            .unwrap();
        enqueue(
            &client,
            &NewJob::new("echo", json!({"fail": true})).queue(queue),
        )
        .await
        .unwrap();
    }
    let config = WorkerConfig {
        lease_queues: vec!["lq".into()],
        ..test_config()
    };
    let mut w = Running::start(worker(&db, config, &[]));
    w.next_events(4, WAIT, |_| true).await;
    w.shutdown().await;
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!(dead, 2);
    let recorded: i64 = db.scalar("SELECT count(*) FROM pgwake.finished_jobs").await;
    assert_eq!(recorded, 0);
    let keep: Option<String> = db
        .scalar("SELECT keep::text FROM pgwake.history_settings")
        .await;
    assert_eq!(keep, None, "history stays off unless turned on");
}

#[tokio::test]
async fn keep_finished_off_turns_history_off_for_every_worker() {
    let db = migrated_db().await;
    let client = db.client().await;
    let on = pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(86400)))
        .await
        .unwrap();
    assert_eq!(on, Some(Duration::from_secs(86400)));
    // A worker without the flag follows the database's setting.
    let followed = pgwake::admin::history::apply(&client, KeepFinished::Unchanged)
        .await
        .unwrap();
    assert_eq!(followed, on);
    let off = pgwake::admin::history::apply(&client, KeepFinished::Off)
        .await
        .unwrap();
    assert_eq!(off, None);
}

#[tokio::test]
async fn history_command_filters_and_prints_json() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute(
            "INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, result, error, attempts, enqueued_at, finished_at, worker) VALUES
             (1, 'mail', 'send', '{\"to\": \"a\"}', 'done', '{\"sent\": 12345678901234567890}', NULL, 1, now(), now() - interval '2 hours', 'w1'),
             (2, 'mail', 'send', '{\"to\": \"b\"}', 'dead', NULL, 'smtp down', 3, now(), now() - interval '1 minute', 'w1'),
             (3, 'img', 'resize', '{}', 'cancelled', NULL, 'cancelled', 1, now(), now(), NULL)",
        )
        .await
        .unwrap();
    let ids = |args: &[&str]| {
        let mut all = vec!["history", "--json"];
        all.extend_from_slice(args);
        let out = run_pgwake(&all, Some(&db.url));
        assert!(out.status.success(), "{}", stderr_of(&out));
        let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
        rows.iter()
            .map(|r| r["id"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&[]), vec![3, 2, 1], "newest first");
    assert_eq!(ids(&["--queue", "mail"]), vec![2, 1]);
    assert_eq!(ids(&["--task", "resize"]), vec![3]);
    assert_eq!(ids(&["--outcome", "dead"]), vec![2]);
    assert_eq!(ids(&["--since", "1h"]), vec![3, 2]);
    assert_eq!(
        ids(&["--since", "2000-01-01T00:00:00Z", "--limit", "1"]),
        vec![3]
    );

    let out = run_pgwake(&["history", "--json", "--outcome", "done"], Some(&db.url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\"sent\": 12345678901234567890"), "{text}");
    let rows: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(rows[0]["payload"], json!({"to": "a"}));
    assert_eq!(rows[0]["worker"], json!("w1"));

    let out = run_pgwake(&["history", "--outcome", "dead"], Some(&db.url));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("smtp down"), "{text}");

    let out = run_pgwake(&["history", "--outcome", "lost"], Some(&db.url));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(stderr_of(&out).contains("--outcome"), "{}", stderr_of(&out));
}

#[tokio::test]
async fn keep_finished_below_an_hour_is_refused_naming_the_flag() {
    let out = run_pgwake(
        &["run", "--keep-finished", "5m", "--handler", "t=exec:true"],
        Some("postgres://nobody@127.0.0.1:1/none"),
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(
        stderr_of(&out).contains("--keep-finished"),
        "{}",
        stderr_of(&out)
    );
}

/// Lease mode: deletes its own lease while it runs (as if the lease had
/// expired, been rescued and the job finished elsewhere), then returns a
/// result.
struct LosesItsLease;

#[async_trait]
impl Handler for LosesItsLease {
    async fn handle(&self, job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let conn = ctx.pool().get().await?;
        conn.execute("DELETE FROM pgwake.leased_jobs WHERE id = $1", &[&job.id])
            .await?;
        Ok(Outcome::done_with(json!({"late": true})))
    }

    fn delivery(&self) -> pgwake::Delivery {
        pgwake::Delivery::Lease
    }
}

#[tokio::test]
async fn a_fenced_out_lease_records_no_history() {
    let db = migrated_db().await;
    let client = db.client().await;
    let id = enqueue(&client, &NewJob::new("late", json!({})))
        .await
        .unwrap();
    let w = Worker::builder(db.config())
        .config(history_config())
        .handler("late", LosesItsLease)
        .build()
        .unwrap();
    let mut w = Running::start(w);
    let ev = w.next_events(1, WAIT, |e| e.id == id).await;
    w.shutdown().await;
    assert_eq!(ev[0].outcome(), "lost");
    assert!(history_of(&client, id).await.is_empty());
}

#[tokio::test]
async fn a_worker_role_with_the_documented_grants_records_and_maintains_history() {
    let db = migrated_db().await;
    let admin = db.client().await;
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
                 IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'rl_history_worker') THEN
                     CREATE ROLE rl_history_worker LOGIN PASSWORD 'pw' NOSUPERUSER NOCREATEDB NOCREATEROLE;
                 END IF;
             END $$;
             GRANT CONNECT ON DATABASE {} TO rl_history_worker;
             SELECT pgwake.grant_worker('rl_history_worker');",
            db.name
        ))
        .await
        .unwrap();
    let mut cfg = db.config();
    cfg.user("rl_history_worker");
    cfg.password("pw");
    let done = enqueue(&admin, &NewJob::new("echo", json!({})))
        .await
        .unwrap();
    let dead = enqueue(
        &admin,
        &NewJob::new("echo", json!({"fail": true})).queue("lq"),
    )
    .await
    .unwrap();
    let w = Worker::builder(cfg.clone())
        .config(history_config())
        .handler("echo", Echo)
        .build()
        .unwrap();
    let mut w = Running::start(w);
    w.next_events(2, WAIT, |_| true).await;
    w.shutdown().await;
    assert_eq!(history_of(&admin, done).await[0].0, "done");
    assert_eq!(history_of(&admin, dead).await[0].0, "dead");
    let pool = pgwake::connect::pool(&cfg, 1).unwrap();
    let report = Maintenance::new(pool, HistoryConfig::default())
        .run_once()
        .await
        .unwrap();
    assert!(report.maintained && report.failed.is_empty(), "{report:?}");
}

// ------------------------------------------------------------------ bench

/// Drain `n` no-op jobs of `queue` with a fresh worker; jobs per second.
async fn drain_rate(db: &TestDb, queue: &str, n: usize, history: KeepFinished) -> f64 {
    let client = db.client().await;
    client
        .execute(
            "INSERT INTO pgwake.jobs (queue, task, payload) \
             SELECT $1, 'echo', jsonb_build_object('n', g) FROM generate_series(1, $2::int) g",
            &[&queue, &(n as i32)],
        )
        .await
        .unwrap();
    let config = WorkerConfig {
        concurrency: 8,
        batch: 100,
        history: HistoryConfig::keeping(history),
        lease_queues: vec!["lq".into()],
        ..test_config()
    };
    let started = std::time::Instant::now();
    let w = Running::start(worker(db, config, &[]));
    wait_for_every(
        "the backlog drained",
        Duration::from_secs(600),
        Duration::from_millis(5),
        async || {
            let left: i64 = client
                .query_one(
                    "SELECT (SELECT count(*) FROM pgwake.jobs) + (SELECT count(*) FROM pgwake.leased_jobs)",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if left == 0 { Ok(()) } else { Err(format!("{left} left")) }
        },
    )
    .await;
    let rate = n as f64 / started.elapsed().as_secs_f64();
    w.shutdown().await;
    rate
}

/// Figures for the README (run by hand; prints, asserts nothing about
/// time): `cargo test --release --test services history:: -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark: run by hand"]
async fn bench_history_cost_per_job_and_retention() {
    let db = migrated_db().await;
    let client = db.client().await;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (queue, n) in [("default", 20_000), ("lq", 5_000)] {
        let (mut off, mut on) = (Vec::new(), Vec::new());
        // Interleaved, so drift hits both alike.
        for _ in 0..3 {
            off.push(drain_rate(&db, queue, n, KeepFinished::Off).await);
            on.push(
                drain_rate(
                    &db,
                    queue,
                    n,
                    KeepFinished::Keep(Duration::from_secs(86400)),
                )
                .await,
            );
            client
                .batch_execute("TRUNCATE pgwake.finished_jobs")
                .await
                .unwrap();
        }
        let (off, on) = (median(off), median(on));
        println!(
            "{queue}: history off {off:.0} jobs/s, on {on:.0} jobs/s ({:+.1}%), {:.1} µs more per job",
            (on / off - 1.0) * 100.0,
            (1.0 / on - 1.0 / off) * 1e6
        );
    }
    // Retention: one day of 1,000,000 rows, dropped whole, against deleting
    // the same rows.
    pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(86400)))
        .await
        .unwrap();
    let fill = "INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, result, attempts, enqueued_at, finished_at)
         SELECT g, 'q', 't', '{\"n\": 1}', 'done', '{\"ok\": true}', 1, now() - interval '10 days', now() - interval '10 days'
         FROM generate_series(1, 1000000) g";
    client
        .batch_execute(&format!(
            "SELECT pgwake.history_partition((now() AT TIME ZONE 'UTC')::date - 10); {fill}; ANALYZE pgwake.finished_jobs"
        ))
        .await
        .unwrap();
    let pool = pgwake::connect::pool(&db.config(), 2).unwrap();
    let t = std::time::Instant::now();
    let report = Maintenance::new(pool, HistoryConfig::default())
        .run_once()
        .await
        .unwrap();
    let drop_ms = t.elapsed().as_secs_f64() * 1000.0;
    assert_eq!(report.dropped, 1);
    client
        .batch_execute(&format!(
            "SELECT pgwake.history_partition((now() AT TIME ZONE 'UTC')::date - 10); {fill}"
        ))
        .await
        .unwrap();
    let t = std::time::Instant::now();
    client
        .batch_execute(
            "DELETE FROM pgwake.finished_jobs WHERE finished_at < now() - interval '7 days'",
        )
        .await
        .unwrap();
    let delete_ms = t.elapsed().as_secs_f64() * 1000.0;
    println!(
        "retention of 1,000,000 rows: partition dropped in {drop_ms:.0} ms (maintenance round), DELETE of the same rows {delete_ms:.0} ms (plus the vacuum it leaves)"
    );
}

/// `pgwake bench` once emptied every pgwake table between its runs, the
/// one-row history setting among them; every worker after that refused to
/// start ("query returned an unexpected number of rows", followed by advice
/// to check that the server is running). A missing row reads as "off", and
/// `--keep-finished` brings it back.
#[tokio::test]
async fn a_deleted_history_setting_reads_as_off_and_keep_finished_restores_it() {
    let db = migrated_db().await;
    let client = db.client().await;
    client
        .batch_execute("DELETE FROM pgwake.history_settings")
        .await
        .unwrap();
    let off = pgwake::admin::history::apply(&client, KeepFinished::Unchanged)
        .await
        .unwrap();
    assert_eq!(off, None);
    let on = pgwake::admin::history::apply(&client, KeepFinished::Keep(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!(on, Some(Duration::from_secs(3600)));
    let rows: i64 = db
        .scalar("SELECT count(*) FROM pgwake.history_settings")
        .await;
    assert_eq!(rows, 1);

    // And a driver's check of an answer is not mistaken for an unreachable
    // server (the command line would say "check the host and port").
    let e = client
        .query_one("SELECT 1 WHERE false", &[])
        .await
        .unwrap_err();
    let e = pgwake::Error::db("reading")(e);
    assert!(!e.is_unreachable(), "{e}");
    assert!(!e.is_connection_lost(), "{e}");
}

#[tokio::test]
async fn history_pages_with_after_and_says_when_more_rows_exist() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Seven rows: two share a finish time (the id breaks the tie), one job
    // finished twice (dead, then retried and done).
    client
        .batch_execute(
            "INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, attempts, enqueued_at, finished_at)
             SELECT g, 'q', 't', '{}', 'done', 1, now(), timestamptz '2026-11-27 12:00:00+00' + make_interval(secs => g)
             FROM generate_series(1, 4) g;
             INSERT INTO pgwake.finished_jobs (id, queue, task, payload, outcome, attempts, enqueued_at, finished_at) VALUES
             (5, 'q', 't', '{}', 'done', 1, now(), timestamptz '2026-11-27 12:00:04+00'),
             (6, 'q', 't', '{}', 'dead', 1, now(), timestamptz '2026-11-27 11:00:00.000001+00'),
             (6, 'q', 't', '{}', 'done', 2, now(), timestamptz '2026-11-27 12:00:05+00')",
        )
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut args = vec!["history".to_string(), "--limit".into(), "3".into()];
        if let Some(a) = &after {
            args.extend(["--after".to_string(), a.clone()]);
        }
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let out = run_pgwake(&args, Some(&db.url));
        assert!(out.status.success(), "{}", stderr_of(&out));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        pages += 1;
        for line in text.lines().filter(|l| l.contains(" finished ")) {
            let cells: Vec<&str> = line.split_whitespace().collect();
            seen.push((cells[0].parse::<i64>().unwrap(), cells[3].to_string()));
        }
        match text.lines().find_map(|l| l.strip_prefix("(more: --after ")) {
            Some(rest) => after = Some(rest.trim_end_matches(')').to_string()),
            None => break,
        }
        assert!(pages < 5, "{text}");
    }
    assert_eq!(pages, 3, "7 rows, 3 a page: the last page says no more");
    let want: Vec<(i64, String)> = [
        (6, "done"),
        (5, "done"),
        (4, "done"),
        (3, "done"),
        (2, "done"),
        (1, "done"),
        (6, "dead"),
    ]
    .iter()
    .map(|(id, o)| (*id, o.to_string()))
    .collect();
    assert_eq!(seen, want, "every row once, newest first");

    // JSON: the array alone on stdout, the hint on stderr.
    let out = run_pgwake(&["history", "--json", "--limit", "7"], Some(&db.url));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.len(), 7);
    assert!(!stderr_of(&out).contains("more:"), "{}", stderr_of(&out));
    let out = run_pgwake(&["history", "--json", "--limit", "6"], Some(&db.url));
    assert!(
        stderr_of(&out).contains("more: --after 2026-11-27T12:00:01.000000Z/1"),
        "{}",
        stderr_of(&out)
    );

    let out = run_pgwake(&["history", "--after", "yesterday"], Some(&db.url));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("expected TIME/ID"),
        "{}",
        stderr_of(&out)
    );
}
