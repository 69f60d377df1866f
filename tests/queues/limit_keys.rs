//! A job's limit key (issue 24, migration 0020): every producer can set it,
//! a queue's `--limit-key-path` derives it from the payload for producers
//! that cannot, and it stays with the job through a retry, a burial and a
//! `pgwake dead retry`, in both delivery modes.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};
use pgwake::{async_trait, BoxError, Delivery, Handler, Job, JobContext, Outcome};

const WAIT: Duration = Duration::from_secs(60);

async fn limit_key_of(c: &tokio_postgres::Client, table: &str, id: i64) -> Option<String> {
    c.query_one(
        &format!("SELECT limit_key FROM pgwake.{table} WHERE id = $1"),
        &[&id],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn every_producer_sets_the_limit_key_and_the_queue_path_fills_it() {
    let db = migrated_db().await;
    let c = db.client().await;
    // Set through the command line, as an operator would.
    let out = process::run_pgwake(
        &["queue", "set", "exports", "--limit-key-path", "customer_id"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", process::stderr_of(&out));

    // The client: an explicit key wins over the payload's field.
    let explicit = enqueue(
        &c,
        &NewJob::new("t", serde_json::json!({"customer_id": "c1"}))
            .queue("exports")
            .limit_key("paid"),
    )
    .await
    .unwrap();
    // The client without a key: the queue's path.
    let derived = enqueue(
        &c,
        &NewJob::new("t", serde_json::json!({"customer_id": 42})).queue("exports"),
    )
    .await
    .unwrap();
    // A plain INSERT that knows nothing of keys.
    let plain: i64 = c
        .query_one(
            "INSERT INTO pgwake.jobs (queue, task, payload) \
             VALUES ('exports', 't', '{\"customer_id\": \"c7\"}') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // SQL producers.
    let sql: i64 = c
        .query_one(
            "SELECT pgwake.enqueue('t', '{}', 'other', limit_key => 'k9')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let unique: i64 = c
        .query_one(
            "SELECT id FROM pgwake.enqueue_unique('t', '{}', 'other', unique_key => 'u', limit_key => 'k10')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // Another queue has no path: no key.
    let none = enqueue(
        &c,
        &NewJob::new("t", serde_json::json!({"customer_id": "c1"})).queue("other"),
    )
    .await
    .unwrap();
    // NDJSON through the command line, and --limit-key.
    let out = process::run_pgwake_stdin(
        &["enqueue", "--ndjson"],
        Some(&db.url),
        "{\"task\": \"t\", \"queue\": \"other\", \"limit_key\": \"nd\"}\n",
    );
    assert!(out.status.success(), "{}", process::stderr_of(&out));
    let ndjson: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let out = process::run_pgwake(
        &[
            "enqueue",
            "--task",
            "t",
            "--queue",
            "other",
            "--limit-key",
            "cli",
        ],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", process::stderr_of(&out));
    let cli: i64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();

    for (id, want) in [
        (explicit, Some("paid")),
        (derived, Some("42")),
        (plain, Some("c7")),
        (sql, Some("k9")),
        (unique, Some("k10")),
        (none, None),
        (ndjson, Some("nd")),
        (cli, Some("cli")),
    ] {
        assert_eq!(
            limit_key_of(&c, "jobs", id).await.as_deref(),
            want,
            "job {id}"
        );
    }

    // `pgwake queue list` shows the path; `pgwake job show` the key.
    let out = process::run_pgwake(&["queue", "list", "--json"], Some(&db.url));
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        list.contains("\"limit_key_path\": \"customer_id\""),
        "{list}"
    );
    let out = process::run_pgwake(&["job", "show", &explicit.to_string()], Some(&db.url));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("limit key  paid"), "{shown}");

    // A path that is no field name is refused, naming the fix.
    let out = process::run_pgwake(
        &["queue", "set", "exports", "--limit-key-path", ""],
        Some(&db.url),
    );
    assert!(!out.status.success());
    assert!(
        process::stderr_of(&out).contains("--limit-key-path"),
        "{}",
        process::stderr_of(&out)
    );
}

/// Fails every attempt.
struct Failing(Delivery);

#[async_trait]
impl Handler for Failing {
    fn delivery(&self) -> Delivery {
        self.0
    }

    async fn handle(&self, _job: &Job, _ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        Err("no".into())
    }
}

/// Attempt 1 fails and is put back (requeue), attempt 2 fails and is
/// buried, `pgwake dead retry` brings it back: the key is the same at
/// every step.
async fn the_limit_key_stays_with_the_job(delivery: Delivery) {
    let db = migrated_db().await;
    let c = db.client().await;
    let mut job = NewJob::new("failing", serde_json::json!({}))
        .queue("q")
        .limit_key("tenant-1");
    job.max_attempts = Some(2);
    let id = enqueue(&c, &job).await.unwrap();
    let worker = pgwake::Worker::builder(db.config())
        .config(test_config())
        .handler("failing", Failing(delivery))
        .build()
        .unwrap();
    let w = Running::start(worker);
    let cc = db.client().await;
    eventually("the job is dead", WAIT, || async {
        cc.query_one(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    })
    .await;
    w.shutdown().await;
    let attempts: i32 = c
        .query_one(
            "SELECT attempts FROM pgwake.dead_jobs WHERE id = $1",
            &[&id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(attempts, 2, "one retry, then buried");
    assert_eq!(
        limit_key_of(&c, "dead_jobs", id).await.as_deref(),
        Some("tenant-1")
    );
    pgwake::admin::dead::retry(
        &c,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![id]),
            queue: None,
            all: false,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        limit_key_of(&c, "jobs", id).await.as_deref(),
        Some("tenant-1")
    );
}

#[tokio::test]
async fn the_limit_key_stays_with_a_retried_and_buried_job_tx() {
    the_limit_key_stays_with_the_job(Delivery::Tx).await;
}

#[tokio::test]
async fn the_limit_key_stays_with_a_retried_and_buried_job_lease() {
    the_limit_key_stays_with_the_job(Delivery::Lease).await;
}

/// Every way a job leaves records its limit key in the history
/// (`pgwake.finished_jobs`): done, buried after its last attempt (by the
/// worker of `extra`'s mode), cancelled while waiting, and a lease rescued
/// on its last attempt; a `pgwake dead retry` of the buried job keeps it.
///
/// Teeth: without `limit_key` in `pgwake.record_dead()` (the history
/// trigger of pgwake.dead_jobs, functions/jobs.sql) the dead, cancelled and
/// rescued rows have none.
async fn every_way_out_records_the_limit_key_in_the_history(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let c = db.client().await;
    c.batch_execute(
        "UPDATE pgwake.history_settings SET keep = interval '1 day';
         INSERT INTO pgwake.jobs (queue, task, payload, limit_key, max_attempts)
         VALUES ('q', 'work', '{}', 'k-done', 25), ('q', 'fail', '{}', 'k-dead', 1);
         INSERT INTO pgwake.jobs (queue, task, payload, limit_key, run_at)
         VALUES ('q', 'work', '{}', 'k-cancel', now() + interval '1 day');
         -- A lease whose worker died on its last attempt.
         INSERT INTO pgwake.leased_jobs
             (id, queue, task, payload, priority, attempts, max_attempts, created_at, run_at,
              worker_id, leased_at, lease_until, limit_key)
         VALUES (900001, 'q', 'work', '{}', 0, 1, 1, now(), now(), 'gone', now(),
                 now() - interval '1 second', 'k-rescued');",
    )
    .await
    .unwrap();
    let cancel: i64 = db
        .scalar("SELECT id FROM pgwake.jobs WHERE limit_key = 'k-cancel'")
        .await;
    let dead: i64 = db
        .scalar("SELECT id FROM pgwake.jobs WHERE limit_key = 'k-dead'")
        .await;
    pgwake::admin::cancel::cancel(&c, cancel).await.unwrap();
    c.batch_execute("SELECT * FROM pgwake.rescue(10)")
        .await
        .unwrap();
    let worker = ChaosWorker::spawn(&db, extra);
    until_drained(&db).await;
    eventually("the failing job is dead", WAIT, || async {
        c.query_one(
            "SELECT count(*) FROM pgwake.dead_jobs WHERE id = $1",
            &[&dead],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
            == 1
    })
    .await;
    assert!(worker.terminate().await.success());
    let rows: Vec<(String, Option<String>)> = c
        .query(
            "SELECT outcome, limit_key FROM pgwake.finished_jobs ORDER BY outcome, limit_key",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let row = |o: &str, k: &str| (o.to_string(), Some(k.to_string()));
    assert_eq!(
        rows,
        vec![
            row("cancelled", "k-cancel"),
            row("dead", "k-dead"),
            row("dead", "k-rescued"),
            row("done", "k-done"),
        ]
    );
    pgwake::admin::dead::retry(
        &c,
        &pgwake::admin::dead::Selection {
            ids: Some(vec![dead]),
            queue: None,
            all: false,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        limit_key_of(&c, "jobs", dead).await.as_deref(),
        Some("k-dead")
    );
}

#[tokio::test]
async fn every_way_out_records_the_limit_key_in_the_history_tx() {
    every_way_out_records_the_limit_key_in_the_history(&[]).await;
}

#[tokio::test]
async fn every_way_out_records_the_limit_key_in_the_history_lease() {
    every_way_out_records_the_limit_key_in_the_history(&["--lease-handler"]).await;
}

/// `pgwake queue set` with several flags sets them in one transaction
/// (issue 33, item 11): when a later one is refused by the server, none is
/// set. Here the first limit-key path needs an insert trigger, which a
/// producer's open transaction holds back past its 5 s wait; before, the
/// `--max-running 3` given with it was committed on its own all the same.
#[tokio::test]
async fn queue_set_changes_every_setting_or_none() {
    let db = migrated_db().await;
    let producer = db.client().await;
    producer
        .batch_execute("BEGIN; INSERT INTO pgwake.jobs (task, queue) VALUES ('t', 'other')")
        .await
        .unwrap();
    let url = db.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        process::run_pgwake(
            &[
                "queue",
                "set",
                "q",
                "--max-running",
                "3",
                "--limit-key-path",
                "customer",
            ],
            Some(&url),
        )
    })
    .await
    .unwrap();
    assert!(!out.status.success(), "{}", process::stderr_of(&out));
    assert!(
        process::stderr_of(&out).contains("try again"),
        "{}",
        process::stderr_of(&out)
    );
    assert!(
        out.stdout.is_empty(),
        "nothing said set: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let set: i64 = db
        .scalar("SELECT count(*) FROM pgwake.queues WHERE name = 'q'")
        .await;
    assert_eq!(set, 0, "--max-running was not set on its own");
    producer.batch_execute("ROLLBACK").await.unwrap();
}
