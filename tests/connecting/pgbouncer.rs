//! Debian's PgBouncer (1.18) in front of a real PostgreSQL, LISTEN straight
//! to the server (`--listen-database-url`):
//!
//! - transaction pooling with a pool smaller than the clients, so server
//!   connections are really shared: producers (`pgwake enqueue`, the Rust
//!   client, `pgwake schedule`, `pgwake stats`, `pgwake dead`, `pgwake
//!   cancel`) and the worker's claims in both delivery modes with
//!   `--prepared-statements unnamed`, and without the flag: the default
//!   (`auto`) finds the pooler and sends unnamed statements by itself, and
//!   polls when LISTEN would go through the pooler; named statements forced
//!   through it are refused at start with the flag to set;
//! - session pooling: the worker with its default cached statements.
//!
//! pgwake sends no startup `options` (PgBouncer's default configuration
//! refuses them). Every catalogued statement's declared parameter types are
//! checked against the server's here too (the unnamed statements send
//! them). The install step (`.ci/deps`) installs pgbouncer; without it these
//! tests fail, they never skip.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use common::embedded::Cluster;
use common::pgbouncer::Bouncer;
use common::*;
use pgwake::{Outcome, Worker};

#[tokio::test]
async fn cached_statements_through_session_pooling_lose_nothing() {
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let direct = cluster.url("postgres");
    {
        // migrate goes to the server directly (it holds a session lock).
        let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
            .await
            .unwrap();
        pgwake::admin::schema::migrate(&mut c).await.unwrap();
    }
    let bouncer = Bouncer::start(&cluster, 40).await;
    let producer_url = bouncer.url("app_tx");

    // Producers through transaction pooling: plain SQL (the simple query
    // protocol: no named prepared statements, which PgBouncer 1.18 cannot
    // carry between transactions).
    let producer = pgwake::connect::connect(&pgwake::connect::parse_url(&producer_url).unwrap())
        .await
        .unwrap();
    producer
        .batch_execute(
            "INSERT INTO pgwake.jobs (task, queue) SELECT 'ok', 'q' || (i % 4) FROM generate_series(1, 300) i;
             INSERT INTO pgwake.jobs (task, queue) SELECT 'ok', 'long' FROM generate_series(1, 20) i;
             INSERT INTO pgwake.jobs (task) SELECT 'fail_once' FROM generate_series(1, 20) i;
             INSERT INTO pgwake.jobs (task, max_attempts) SELECT 'doomed', 2 FROM generate_series(1, 5) i;",
        )
        .await
        .unwrap();
    // `pgwake enqueue` (extended protocol) through session pooling.
    let out = pgwake_cmd()
        .env("DATABASE_URL", bouncer.url("app_session"))
        .args(["enqueue", "--task", "ok"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let expected: Vec<i64> = {
        let c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
            .await
            .unwrap();
        c.query("SELECT id FROM pgwake.jobs", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    };
    assert_eq!(expected.len(), 346);

    // The worker: claims (both modes) through PgBouncer, LISTEN direct.
    let ledger = Ledger::default();
    let worker = Worker::builder(pgwake::connect::parse_url(&bouncer.url("app_session")).unwrap())
        .listen_database(pgwake::connect::parse_url(&direct).unwrap())
        .config(pgwake::WorkerConfig {
            lease_queues: vec!["long".into()],
            sample_interval: Some(Duration::from_millis(200)),
            ..test_config()
        })
        .handler("ok", ok_handler(&ledger))
        .handler(
            "fail_once",
            Recording {
                ledger: ledger.clone(),
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
                ledger: ledger.clone(),
                behaviour: |_: &pgwake::Job| Err("always fails".into()),
            },
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w
        .next_events(expected.len(), Duration::from_secs(120), |e| {
            matches!(e.outcome(), "done" | "dead")
        })
        .await;
    let dead = events.iter().filter(|e| e.outcome() == "dead").count();
    assert_eq!(dead, 5);
    ledger.check(&expected);
    // A job inserted now, through the transaction pool, wakes the worker
    // through the direct LISTEN.
    w.until_waiting(&TestDb {
        url: direct.clone(),
        name: "postgres".into(),
    })
    .await;
    let rows = producer
        .simple_query("SELECT pgwake.enqueue('ok')")
        .await
        .unwrap();
    let id: i64 = rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0)?.parse().ok(),
            _ => None,
        })
        .unwrap();
    let ev = w.next_events(1, Duration::from_secs(30), |_| true).await;
    assert_eq!(ev[0].id, id);
    w.stop.cancel();
    w.join.await.unwrap().unwrap();
    let log = std::fs::read_to_string(bouncer.dir.path().join("pgbouncer.log")).unwrap_or_default();
    assert!(
        !log.contains("unsupported startup parameter"),
        "pgwake sent a startup parameter PgBouncer refuses:\n{log}"
    );
}

/// A throwaway cluster with the pgwake schema; its direct URL.
async fn migrated_cluster() -> (Cluster, String) {
    let cluster = tokio::task::spawn_blocking(Cluster::start)
        .await
        .unwrap()
        .expect("start PostgreSQL");
    let direct = cluster.url("postgres");
    let mut c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
        .await
        .unwrap();
    pgwake::admin::schema::migrate(&mut c).await.unwrap();
    (cluster, direct)
}

/// Run `pgwake args` with `DATABASE_URL=url` (and `stdin`), expecting
/// success; its stdout.
fn pgwake_ok(url: &str, args: &[&str], stdin: &str) -> String {
    use std::io::Write;
    let mut child = pgwake_cmd()
        .env("DATABASE_URL", url)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "pgwake {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// What the pgbouncer log says about prepared statements (it logs every
/// error it passes on): nothing, when no named statement was ever used
/// across transactions.
fn prepared_statement_errors(bouncer: &Bouncer) -> Vec<String> {
    std::fs::read_to_string(bouncer.dir.path().join("pgbouncer.log"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("prepared statement"))
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_full_workload_through_transaction_pooling_with_unnamed_statements_loses_nothing() {
    let (cluster, direct) = migrated_cluster().await;
    // 5 server connections for 4 claim tasks (tx-mode claims hold one each
    // while their batch runs, and their batch mark needs one more), shared
    // by about a dozen client connections: the worker's pool (6), its ledger
    // pool (2), the producers and the commands below.
    let bouncer = Bouncer::start(&cluster, 5).await;
    let tx_url = bouncer.url("app_tx");
    let direct_client = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
        .await
        .unwrap();
    direct_client
        .batch_execute(
            "CREATE TABLE written (job_id bigint PRIMARY KEY);
             CREATE TABLE sql_calls (n int);
             CREATE FUNCTION record_call(p jsonb) RETURNS void LANGUAGE sql
                 AS $$ INSERT INTO sql_calls VALUES ((p->>'n')::int) $$;",
        )
        .await
        .unwrap();

    // Producers, all through the transaction pool.
    // `pgwake enqueue`: one job, and 200 in one transaction (--ndjson).
    pgwake_ok(&tx_url, &["enqueue", "--task", "ok"], "");
    let lines: String = (0..200)
        .map(|i| format!("{{\"task\": \"ok\", \"queue\": \"q{}\"}}\n", i % 4))
        .collect();
    pgwake_ok(&tx_url, &["enqueue", "--ndjson"], &lines);
    // A scheduled job (run_at 1 s from now, by the database's clock).
    pgwake_ok(&tx_url, &["enqueue", "--task", "ok", "--delay", "1s"], "");
    // The Rust client on a plain connection through the pooler.
    let producer = pgwake::connect::connect(&pgwake::connect::parse_url(&tx_url).unwrap())
        .await
        .unwrap();
    use pgwake::client::{enqueue_many, NewJob};
    let mut jobs = Vec::new();
    for _ in 0..40 {
        jobs.push(NewJob::new("ok", serde_json::json!({})).queue("long"));
        jobs.push(NewJob::new("write", serde_json::json!({})));
    }
    for _ in 0..20 {
        jobs.push(NewJob::new("fail_once", serde_json::json!({})));
    }
    for i in 0..10 {
        jobs.push(NewJob::new("doomed", serde_json::json!({})).max_attempts(2));
        // The sql handler in tx mode (queue `default`) and lease mode.
        jobs.push(NewJob::new("sql", serde_json::json!({ "n": i })));
        jobs.push(NewJob::new("sql", serde_json::json!({ "n": 100 + i })).queue("long"));
    }
    enqueue_many(&producer, &jobs).await.unwrap();
    // A recurring schedule, every second.
    pgwake_ok(
        &tx_url,
        &[
            "schedule",
            "add",
            "--name",
            "tick",
            "--cron",
            "* * * * * *",
            "--task",
            "tick",
        ],
        "",
    );
    let expected: Vec<i64> = direct_client
        .query("SELECT id FROM pgwake.jobs WHERE task <> 'sql'", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(expected.len(), 1 + 200 + 1 + 80 + 20 + 10);

    let ledger = Ledger::default();
    let worker = Worker::builder(pgwake::connect::parse_url(&tx_url).unwrap())
        .listen_database(pgwake::connect::parse_url(&direct).unwrap())
        .config(pgwake::WorkerConfig {
            lease_queues: vec!["long".into()],
            sample_interval: Some(Duration::from_millis(200)),
            rescue_interval: Duration::from_millis(200),
            prepared_statements: pgwake::config::PreparedStatements::Unnamed,
            ..test_config()
        })
        .handler("ok", ok_handler(&ledger))
        .handler("tick", ok_handler(&Ledger::default()))
        .handler("write", Writing(ledger.clone()))
        .handler(
            "fail_once",
            Recording {
                ledger: ledger.clone(),
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
                ledger: ledger.clone(),
                behaviour: |_: &pgwake::Job| Err("always fails".into()),
            },
        )
        .handler(
            "sql",
            pgwake::handlers::sql::SqlHandler::parse("record_call").unwrap(),
        )
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    let events = w
        .next_events(expected.len() + 20, Duration::from_secs(180), |e| {
            e.task != "tick" && matches!(e.outcome(), "done" | "dead")
        })
        .await;
    assert_eq!(events.iter().filter(|e| e.outcome() == "dead").count(), 10);
    assert!(
        events
            .iter()
            .all(|e| e.task == "doomed" || e.outcome() == "done"),
        "{events:?}"
    );
    // Every job ran exactly as often as its handler asked: once, or twice
    // for the ones that fail once and the ones that die on attempt 2.
    let dupes = ledger.check(&expected);
    let twice: std::collections::HashSet<i64> = direct_client
        .query("SELECT id FROM pgwake.dead_jobs", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(twice.len(), 10, "the doomed jobs are dead");
    let fail_once: Vec<i64> = events
        .iter()
        .filter(|e| e.task == "fail_once")
        .map(|e| e.id)
        .collect();
    let mut want: Vec<(i64, usize)> = twice
        .iter()
        .chain(fail_once.iter())
        .map(|id| (*id, 2))
        .collect();
    want.sort();
    assert_eq!(dupes, want, "runs beyond the expected retries");
    // What the handlers wrote through the claim transaction committed with
    // the jobs: every `write` job once, every sql call once.
    let written: i64 = direct_client
        .query_one("SELECT count(*) FROM written", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(written, 40);
    let calls: Vec<i32> = direct_client
        .query("SELECT n FROM sql_calls ORDER BY n", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let want_calls: Vec<i32> = (0..10).chain(100..110).collect();
    assert_eq!(calls, want_calls);
    // The schedule's ticks ran too.
    w.next_events(1, Duration::from_secs(30), |e| {
        e.task == "tick" && e.outcome() == "done"
    })
    .await;
    pgwake_ok(&tx_url, &["schedule", "remove", "tick"], "");
    // The commands that read through the pool.
    let stats = pgwake_ok(&tx_url, &["stats", "--json"], "");
    assert!(stats.contains("\"dead\": 10"), "{stats}");
    let dead = pgwake_ok(&tx_url, &["dead", "list", "--json"], "");
    assert_eq!(dead.matches("always fails").count(), 10, "{dead}");
    // `pgwake cancel` through the pooler: a job due in an hour leaves the
    // queue for the dead jobs.
    let later = pgwake_ok(&tx_url, &["enqueue", "--task", "ok", "--delay", "1h"], "");
    pgwake_ok(&tx_url, &["cancel", later.trim()], "");
    w.shutdown().await;
    let purged = pgwake_ok(&tx_url, &["dead", "purge", "--all"], "");
    assert!(purged.contains("11"), "{purged}");

    // Nothing left behind: no job, no lease, no batch marker.
    let left: i64 = direct_client
        .query_one(
            "SELECT (SELECT count(*) FROM pgwake.jobs WHERE task <> 'tick')
                  + (SELECT count(*) FROM pgwake.leased_jobs)
                  + (SELECT count(*) FROM pgwake.tx_batches)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);
    let dead_left: i64 = direct_client
        .query_one("SELECT count(*) FROM pgwake.dead_jobs", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead_left, 0, "purged through the pooler");
    let errors = prepared_statement_errors(&bouncer);
    assert!(errors.is_empty(), "{errors:#?}");
}

/// Writes the job's id through the claim transaction, with a plain
/// `execute(&str)` as a handler author would (a named statement, prepared
/// and closed inside the transaction: one server connection throughout).
struct Writing(Ledger);

#[pgwake::async_trait]
impl pgwake::Handler for Writing {
    async fn handle(
        &self,
        job: &pgwake::Job,
        ctx: pgwake::JobContext<'_>,
    ) -> Result<Outcome, pgwake::BoxError> {
        self.0.record(job);
        let tx = ctx.transaction().await?.expect("a tx-mode job");
        tx.execute("INSERT INTO written (job_id) VALUES ($1)", &[&job.id])
            .await?;
        Ok(Outcome::Done)
    }
}

/// Behind PgBouncer in transaction mode the worker needs no flag: it finds
/// the pooler at start, sends its statements unnamed and says so; with LISTEN
/// through the same pooler it polls instead, and says so. What a user forces
/// (`--prepared-statements cached`, or `unnamed` with LISTEN through the
/// pooler) is refused at start naming what to set.
#[tokio::test]
async fn through_transaction_pooling_the_default_worker_switches_to_unnamed_statements_by_itself() {
    let (cluster, direct) = migrated_cluster().await;
    let bouncer = Bouncer::start(&cluster, 5).await;
    let tx_url = bouncer.url("app_tx");
    let refused = |extra: &[&str], env: Option<(&str, &str)>| {
        let mut cmd = pgwake_cmd();
        cmd.env("DATABASE_URL", &tx_url).args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--handler",
            "t=exec:true",
        ]);
        if let Some((k, v)) = env {
            cmd.env(k, v);
        }
        let out = cmd.args(extra).output().unwrap();
        (out.status.code(), stderr_of(&out))
    };
    // Forced named statements: refused before any claim, with what to set.
    let (code, stderr) = refused(
        &[
            "--prepared-statements",
            "cached",
            "--listen-database-url",
            &direct,
        ],
        None,
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("transaction mode") && stderr.contains("--prepared-statements"),
        "{stderr}"
    );
    // The environment variable forces it like the flag.
    let (code, stderr) = refused(
        &["--listen-database-url", &direct],
        Some(("PGWAKE_PREPARED_STATEMENTS", "cached")),
    );
    assert_eq!(code, Some(2), "{stderr}");
    // Forced unnamed statements with LISTEN through the pooler: refused
    // (notifications would never arrive), naming the listen URL.
    let (code, stderr) = refused(&["--prepared-statements", "unnamed"], None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--listen-database-url"), "{stderr}");

    // No flag at all: the worker starts, says what it chose, and runs jobs.
    for (extra, said) in [
        (
            vec![
                "--handler",
                "t=exec:true",
                "--listen-database-url",
                direct.as_str(),
            ],
            "statements are sent unnamed",
        ),
        (vec!["--handler", "t=exec:true"], "polling instead"),
    ] {
        let id: i64 = {
            let c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
                .await
                .unwrap();
            c.query_one("SELECT pgwake.enqueue('t')", &[])
                .await
                .unwrap()
                .get(0)
        };
        let mut child = spawn_pgwake_run(&tx_url, &extra);
        let log = tail_stderr(&mut child);
        let c = pgwake::connect::connect(&pgwake::connect::parse_url(&direct).unwrap())
            .await
            .unwrap();
        wait_for("the job ran", Duration::from_secs(60), async || {
            let left: i64 = c
                .query_one("SELECT count(*) FROM pgwake.jobs WHERE id = $1", &[&id])
                .await
                .unwrap()
                .get(0);
            if left == 0 {
                Ok(())
            } else {
                Err(log.lock().unwrap().clone())
            }
        })
        .await;
        send_signal(&child, libc::SIGTERM);
        let out = wait_exit(child, Duration::from_secs(60)).await;
        let log = log.lock().unwrap().clone();
        assert!(out.status.success(), "{extra:?}: {log}");
        assert!(log.contains(said), "{extra:?}: {log}");
        assert_eq!(
            c.query_one("SELECT count(*) FROM pgwake.dead_jobs", &[])
                .await
                .unwrap()
                .get::<_, i64>(0),
            0,
            "{log}"
        );
    }

    // Through the session pool the start-up check refuses nothing.
    let worker = Worker::builder(pgwake::connect::parse_url(&bouncer.url("app_session")).unwrap())
        .handler("t", ok_handler(&Ledger::default()))
        .build()
        .unwrap();
    worker
        .check()
        .await
        .expect("session pooling passes the check");
}

#[tokio::test]
async fn every_catalogued_statement_declares_the_parameter_types_the_server_infers() {
    let db = migrated_db().await;
    let client = db.client().await;
    for sql in pgwake::internal::sql::ALL {
        let stmt = client
            .prepare(sql.text)
            .await
            .unwrap_or_else(|e| panic!("statement {}: {e:?}", sql.name));
        assert_eq!(stmt.params(), sql.params, "statement {}", sql.name);
    }
}

#[tokio::test]
async fn through_transaction_pooling_a_cached_statement_is_lost_and_an_unnamed_one_is_not() {
    use pgwake::config::PreparedStatements;
    use pgwake::internal::sql::{Db, WAITING_SNAPSHOT};
    let (cluster, _direct) = migrated_cluster().await;
    let bouncer = Bouncer::start(&cluster, 5).await;
    let pool = pgwake::connect::pool(
        &pgwake::connect::parse_url(&bouncer.url("app_tx")).unwrap(),
        2,
    )
    .unwrap();
    let (c1, c2) = (pool.get().await.unwrap(), pool.get().await.unwrap());
    // Prepared (named, cached) on the server connection c1 had then…
    let cached = Db::pooled(&c1, PreparedStatements::Cached);
    cached.query_one(&WAITING_SNAPSHOT, &[]).await.unwrap();
    // …which c2's transaction now holds (PgBouncer reuses the last one).
    c2.batch_execute("BEGIN").await.unwrap();
    let err = cached
        .query_one(&WAITING_SNAPSHOT, &[])
        .await
        .expect_err("the named statement stayed on the other server connection");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME),
        "{err:?}"
    );
    // The unnamed statement, in the same situation, works every time.
    let unnamed = Db::pooled(&c1, PreparedStatements::Unnamed);
    for _ in 0..3 {
        unnamed.query_one(&WAITING_SNAPSHOT, &[]).await.unwrap();
    }
    c2.batch_execute("ROLLBACK").await.unwrap();
}
