//! "Why isn't it running?": `pgwake.explain(id)` names each reason and what
//! ends it. Every reason is created here and read back; `pgwake explain`,
//! `pgwake jobs list` and `pgwake job show` print them, producer values
//! escaped.

use crate::common;

use common::*;
use pgwake::{Worker, WorkerConfig};

/// (reason, detail, blocking_job) of job `id`.
async fn why(c: &tokio_postgres::Client, id: i64) -> Vec<(String, String, Option<i64>)> {
    c.query(
        "SELECT reason, detail, blocking_job FROM pgwake.explain($1)",
        &[&id],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2)))
    .collect()
}

fn reasons(w: &[(String, String, Option<i64>)]) -> Vec<&str> {
    w.iter().map(|r| r.0.as_str()).collect()
}

async fn job(c: &tokio_postgres::Client, sql: &str) -> i64 {
    c.query_one(sql, &[]).await.unwrap().get(0)
}

/// A live worker row serving `tasks` on every queue (as `services::fleet`
/// writes it).
async fn live_worker(c: &tokio_postgres::Client, tasks: &[&str]) {
    let tasks: Vec<String> = tasks.iter().map(|t| t.to_string()).collect();
    c.execute(
        "INSERT INTO pgwake.workers (id, host, pid, version, application_name, tasks, concurrency, expires_at)
         VALUES ('w-' || gen_random_uuid(), 'h', 1, 'test', 'pgwake', $1, 4, now() + interval '1 hour')",
        &[&tasks],
    )
    .await
    .unwrap();
}

/// The `--handler` flag a `no_handler` reason suggests is one a shell
/// takes as it is: a task name with quotes, spaces or `;` is single-quoted,
/// its own single quotes escaped.
#[tokio::test]
async fn the_suggested_handler_flag_is_quoted_for_a_shell() {
    let db = migrated_db().await;
    let c = db.client().await;
    live_worker(&c, &["other"]).await;
    for (task, flag) in [
        ("resize.v2", "`--handler resize.v2=…`"),
        (
            "x\"; rm -rf ~ #it's",
            "`--handler 'x\"; rm -rf ~ #it'\\''s=…'`",
        ),
    ] {
        let id = job(&c, &format!("SELECT pgwake.enqueue({})", quote_sql(task))).await;
        let w = why(&c, id).await;
        assert_eq!(reasons(&w), ["no_handler"]);
        assert!(w[0].1.ends_with(flag), "{task}: {w:?}");
    }
}

/// `s` as an SQL string literal.
fn quote_sql(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

#[tokio::test]
async fn each_reason_a_waiting_job_has_is_named_with_what_ends_it() {
    let db = migrated_db().await;
    let c = db.client().await;

    // No worker at all, then one without the handler, then one with it.
    let plain = job(&c, "SELECT pgwake.enqueue('t')").await;
    assert_eq!(reasons(&why(&c, plain).await), ["no_worker"]);
    live_worker(&c, &["other"]).await;
    let w = why(&c, plain).await;
    assert_eq!(reasons(&w), ["no_handler"]);
    assert!(w[0].1.contains("'t'"), "{w:?}");
    live_worker(&c, &["*"]).await;
    let w = why(&c, plain).await;
    assert_eq!(reasons(&w), ["ready"]);
    assert!(w[0].1.contains("0 ready job(s)"), "{w:?}");

    // Scheduled, and waiting for a retry.
    let later = job(
        &c,
        "SELECT pgwake.enqueue('t', run_at => now() + interval '1 hour')",
    )
    .await;
    assert_eq!(reasons(&why(&c, later).await), ["scheduled"]);
    let retry = job(
        &c,
        "INSERT INTO pgwake.jobs (task, run_at, attempts, last_error)
         VALUES ('t', now() + interval '1 minute', 2, 'connection refused') RETURNING id",
    )
    .await;
    let w = why(&c, retry).await;
    assert_eq!(reasons(&w), ["retry_backoff"]);
    assert!(
        w[0].1.contains("attempt 2 failed (connection refused)"),
        "{w:?}"
    );

    // Paused.
    let paused = job(&c, "SELECT pgwake.enqueue('t', queue => 'hold me')").await;
    c.execute("SELECT pgwake.pause_queue('hold me')", &[])
        .await
        .unwrap();
    let w = why(&c, paused).await;
    assert_eq!(reasons(&w), ["paused"]);
    assert!(w[0].1.contains("pgwake queue resume 'hold me'"), "{w:?}");

    // Behind an earlier job of its ordering key.
    let first = job(&c, "SELECT pgwake.enqueue('t', ordering_key => 'k')").await;
    let second = job(&c, "SELECT pgwake.enqueue('t', ordering_key => 'k')").await;
    assert_eq!(reasons(&why(&c, first).await), ["ready"]);
    let w = why(&c, second).await;
    assert_eq!(reasons(&w), ["ordering_key"]);
    assert_eq!(w[0].2, Some(first));
    assert!(w[0].1.contains("is waiting"), "{w:?}");

    // Not found, dead and cancelled.
    assert_eq!(reasons(&why(&c, 1 << 40).await), ["not_found"]);
    let cancelled = job(&c, "SELECT pgwake.enqueue('t', queue => 'gone')").await;
    c.execute("SELECT pgwake.cancel($1)", &[&cancelled])
        .await
        .unwrap();
    assert_eq!(reasons(&why(&c, cancelled).await), ["cancelled"]);
}

#[tokio::test]
async fn running_jobs_say_where_they_run_in_both_modes() {
    let db = migrated_db().await;
    let c = db.client().await;
    live_worker(&c, &["*"]).await;
    let leased = job(&c, "SELECT pgwake.enqueue('t')").await;
    let rows = claim_lease_all(&c, "worker-7").await;
    assert_eq!(rows.len(), 1);
    let w = why(&c, leased).await;
    assert_eq!(reasons(&w), ["running"]);
    assert!(
        w[0].1.contains("lease mode") && w[0].1.contains("worker-7"),
        "{w:?}"
    );

    let in_tx = job(&c, "SELECT pgwake.enqueue('t')").await;
    // A claim transaction as a worker's connection holds it: under the
    // worker's application_name (another session's lock is `locked`).
    let claimer = db.client().await;
    claimer
        .batch_execute("SET application_name = 'pgwake'; BEGIN")
        .await
        .unwrap();
    assert_eq!(claim_tx_all(&claimer).await.len(), 1);
    let w = why(&c, in_tx).await;
    assert_eq!(reasons(&w), ["running"]);
    assert!(w[0].1.contains("tx mode"), "{w:?}");
    claimer.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(reasons(&why(&c, in_tx).await), ["ready"]);
}

#[tokio::test]
async fn a_full_max_running_limit_names_the_jobs_holding_it() {
    let db = migrated_db().await;
    let c = db.client().await;
    live_worker(&c, &["*"]).await;
    let running = job(&c, "SELECT pgwake.enqueue('t', queue => 'q')").await;
    assert_eq!(claim_lease_all(&c, "w").await.len(), 1);
    limit_queue(&db, "q", 1);
    let waiting = job(&c, "SELECT pgwake.enqueue('t', queue => 'q')").await;
    let w = why(&c, waiting).await;
    assert_eq!(reasons(&w), ["max_running"]);
    assert_eq!(w[0].2, Some(running));
    assert!(w[0].1.contains(&format!("running: {running}")), "{w:?}");
}

#[tokio::test]
async fn a_spent_rate_limit_names_the_next_admission() {
    let db = migrated_db().await;
    let c = db.client().await;
    live_worker(&c, &["*"]).await;
    job(&c, "SELECT pgwake.enqueue('t', queue => 'metered')").await;
    c.execute(
        "SELECT pgwake.set_queue_rate('metered', 1, interval '1 hour')",
        &[],
    )
    .await
    .unwrap();
    // One start takes the hour's admission.
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(vec!["metered".into()]),
            ..test_config()
        })
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 1);
    let next = job(&c, "SELECT pgwake.enqueue('t', queue => 'metered')").await;
    let row = c
        .query_one(
            "SELECT reason, until > now() + interval '50 minutes' FROM pgwake.explain($1)",
            &[&next],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "rate_limit");
    assert!(
        row.get::<_, bool>(1),
        "the next admission is an hour after the start"
    );
}

/// What a producer chose (queue, task, keys, payload, error) reaches the
/// terminal escaped: no control character is printed raw.
#[tokio::test]
async fn the_commands_list_show_and_explain_jobs_with_producer_values_escaped() {
    let db = migrated_db().await;
    let c = db.client().await;
    let hostile = "evil\u{1b}[2J\u{7}";
    // A task name with control characters is refused since migration 0025;
    // this row stands for one stored before (the check is NOT VALID).
    c.batch_execute("ALTER TABLE pgwake.jobs DROP CONSTRAINT jobs_task_printable")
        .await
        .unwrap();
    let id: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload, ordering_key, last_error)
             VALUES ($1, jsonb_build_object('customer', 42, 'note', $1::text, 'big', 123456789012345678901234567890),
                     $1, $1)
             RETURNING id",
            &[&hostile],
        )
        .await
        .unwrap()
        .get(0);
    c.batch_execute(
        "ALTER TABLE pgwake.jobs ADD CONSTRAINT jobs_task_printable CHECK (task !~ '[[:cntrl:]]') NOT VALID",
    )
    .await
    .unwrap();
    job(&c, "SELECT pgwake.enqueue('t', '{\"customer\": 7}')").await;
    for args in [
        vec!["jobs", "list"],
        vec!["jobs", "list", "--payload", "customer=42"],
        vec!["job", "show", &id.to_string()],
        vec!["explain", &id.to_string()],
    ] {
        let out = run_pgwake(&args, Some(&db.url));
        assert!(out.status.success(), "{args:?}: {}", stderr_of(&out));
        assert!(
            !out.stdout.iter().any(|b| *b == 0x1b || *b == 0x07),
            "{args:?} printed a control byte raw: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    // The payload filter, as JSON.
    let out = run_pgwake(
        &["jobs", "list", "--payload", "customer=42", "--json"],
        Some(&db.url),
    );
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1);
    assert_eq!(rows[0]["id"], id);
    assert_eq!(rows[0]["task"], hostile);
    // The payload exactly as stored: the 30-digit number is not rounded.
    let out = run_pgwake(&["job", "show", &id.to_string(), "--json"], Some(&db.url));
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        detail["payload"]
            .as_str()
            .unwrap()
            .contains("123456789012345678901234567890"),
        "{detail}"
    );
    assert_eq!(detail["explanation"][0]["reason"], "no_worker");
    // Unknown ids and states exit 2 naming the problem.
    let out = run_pgwake(&["explain", "999999999"], Some(&db.url));
    assert_eq!(out.status.code(), Some(2));
    let out = run_pgwake(&["job", "show", "999999999"], Some(&db.url));
    assert_eq!(out.status.code(), Some(2));
    let out = run_pgwake(&["jobs", "list", "--state", "sleeping"], Some(&db.url));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("waiting, scheduled"),
        "{}",
        stderr_of(&out)
    );
}

/// Fails every run, naming its attempt.
struct FailsNamingItsAttempt;

#[pgwake::async_trait]
impl pgwake::Handler for FailsNamingItsAttempt {
    async fn handle(
        &self,
        job: &pgwake::Job,
        _: pgwake::JobContext<'_>,
    ) -> Result<pgwake::Outcome, pgwake::BoxError> {
        Err(format!("boom on attempt {}", job.attempt).into())
    }
}

/// Every failed attempt's error is kept (not only the last), in both
/// modes, and `pgwake job show` lists them by attempt.
async fn every_attempts_error_is_kept(lease: bool) {
    let db = migrated_db().await;
    let c = db.client().await;
    let id = job(&c, "SELECT pgwake.enqueue('f', max_attempts => 3)").await;
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            lease_queues: if lease {
                vec!["default".into()]
            } else {
                vec![]
            },
            ..test_config()
        })
        .handler("f", FailsNamingItsAttempt)
        .build()
        .unwrap();
    wait_for(
        "the job to end dead",
        std::time::Duration::from_secs(60),
        async || {
            worker.claim_once().await.map_err(|e| e.to_string())?;
            let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
            if dead == 1 {
                Ok(())
            } else {
                Err("not dead yet".to_string())
            }
        },
    )
    .await;
    let out = run_pgwake(&["job", "show", &id.to_string(), "--json"], Some(&db.url));
    assert!(out.status.success(), "{}", stderr_of(&out));
    let detail: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let errors: Vec<(i64, String)> = detail["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["attempt"].as_i64().unwrap(),
                e["error"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(errors.len(), 3, "{detail}");
    for (i, (attempt, error)) in errors.iter().enumerate() {
        assert_eq!(*attempt, i as i64 + 1);
        assert!(
            error.contains(&format!("boom on attempt {attempt}")),
            "{error}"
        );
    }
    let text = run_pgwake(&["job", "show", &id.to_string()], Some(&db.url));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("boom on attempt 1") && text.contains("boom on attempt 2"),
        "{text}"
    );
}

#[tokio::test]
async fn every_attempts_error_is_kept_tx() {
    every_attempts_error_is_kept(false).await;
}

#[tokio::test]
async fn every_attempts_error_is_kept_lease() {
    every_attempts_error_is_kept(true).await;
}

/// Per-key limits (issue 24): a keyed job waits because its key runs its
/// per-key limit (the key and the limit named, the running job blocking)
/// or because its key's rate is used up (the next admission named); a job
/// without a key in the same queue is ready. The key reaches the terminal
/// escaped.
#[tokio::test]
async fn a_full_or_spent_limit_key_is_named_with_its_limit() {
    let db = migrated_db().await;
    let c = db.client().await;
    live_worker(&c, &["*"]).await;
    let key = "acme\u{1b}[2J";
    // A running job of the key, then a per-key limit of 1.
    let running: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (queue, task, limit_key) VALUES ('tn', 't', $1) RETURNING id",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(claim_lease_all(&c, "w").await.len(), 1);
    c.batch_execute("SELECT pgwake.set_queue_max_running_per_key('tn', 1)")
        .await
        .unwrap();
    let waiting: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (queue, task, limit_key) VALUES ('tn', 't', $1) RETURNING id",
            &[&key],
        )
        .await
        .unwrap()
        .get(0);
    let w = why(&c, waiting).await;
    assert_eq!(reasons(&w), ["key_max_running"]);
    assert_eq!(w[0].2, Some(running));
    assert!(
        w[0].1.contains("runs its limit of 1 job(s)") && w[0].1.contains("acme"),
        "{w:?}"
    );
    let out = run_pgwake(&["explain", &waiting.to_string()], Some(&db.url));
    let shown = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(shown.contains("key_max_running: limit key"), "{shown}");
    assert!(
        !shown.contains('\u{1b}'),
        "the key reached the terminal raw: {shown:?}"
    );

    // A per-key rate of 1 an hour: one start of key k uses it up.
    c.batch_execute(
        "SELECT pgwake.set_queue_rate_per_key('metered', 1, interval '1 hour');
         INSERT INTO pgwake.jobs (queue, task, limit_key) VALUES ('metered', 't', 'k');",
    )
    .await
    .unwrap();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            queues: Some(vec!["metered".into()]),
            ..test_config()
        })
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    assert_eq!(worker.claim_once().await.unwrap(), 1);
    let next = job(
        &c,
        "INSERT INTO pgwake.jobs (queue, task, limit_key) VALUES ('metered', 't', 'k') RETURNING id",
    )
    .await;
    let row = c
        .query_one(
            "SELECT reason, detail, until > now() + interval '50 minutes' FROM pgwake.explain($1)",
            &[&next],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, String>(0), "key_rate_limit");
    assert!(row
        .get::<_, String>(1)
        .contains("limit key 'k' of queue 'metered' started its limit of 1"));
    assert!(
        row.get::<_, bool>(2),
        "the next admission is an hour after the start"
    );
    // The worker agrees: nothing of key k starts now.
    assert_eq!(worker.claim_once().await.unwrap(), 0);
    // A job without a key in the same queue: not held by the key's rate.
    let keyless = job(
        &c,
        "INSERT INTO pgwake.jobs (queue, task) VALUES ('metered', 't') RETURNING id",
    )
    .await;
    assert_eq!(reasons(&why(&c, keyless).await), ["ready"]);
    assert_eq!(worker.claim_once().await.unwrap(), 1);
}

/// `pgwake jobs list` shows a job's limit key beside its other keys, and
/// `pgwake explain` prints each reason once (`scheduled: runs at …`, not
/// `scheduled: scheduled: runs at …`).
#[tokio::test]
async fn the_list_shows_the_limit_key_and_explain_names_each_reason_once() {
    let db = migrated_db().await;
    let c = db.client().await;
    let keyed: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload, limit_key) VALUES ('t', '{}', 'acme') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let later: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (task, payload, run_at) VALUES ('t', '{}', now() + interval '1 hour')
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let out = run_pgwake(&["jobs", "list"], Some(&db.url));
    let list = String::from_utf8_lossy(&out.stdout);
    let line = list
        .lines()
        .find(|l| l.trim_start().starts_with(&keyed.to_string()))
        .unwrap_or_else(|| panic!("job {keyed} listed: {list}"));
    assert!(line.contains("limit acme"), "{line}");
    for id in [keyed, later] {
        let out = run_pgwake(&["explain", &id.to_string()], Some(&db.url));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        for l in text.lines() {
            let (reason, detail) = l.split_once(": ").unwrap_or((l, ""));
            assert!(
                !detail.starts_with(reason),
                "the reason is printed twice: {l}"
            );
        }
    }
}
