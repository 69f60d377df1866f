//! Unique jobs (`unique_key`): at most one waiting job per key, whichever
//! way jobs arrive (pgwake.enqueue, pgwake.enqueue_unique, the Rust client,
//! `pgwake enqueue`, NDJSON, a plain INSERT); a duplicate gets the waiting
//! job's id. Real PostgreSQL, several connections at once.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use common::*;
use pgwake::client::{enqueue_detailed, enqueue_many_detailed, Enqueued, NewJob};
use serde_json::json;

/// The ledger check: every waiting job with a unique key, by key.
async fn waiting_by_key(db: &TestDb) -> HashMap<String, Vec<i64>> {
    let rows = db
        .client()
        .await
        .query(
            "SELECT unique_key, id FROM pgwake.jobs WHERE unique_key IS NOT NULL ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let mut by_key: HashMap<String, Vec<i64>> = HashMap::new();
    for r in rows {
        by_key.entry(r.get(0)).or_default().push(r.get(1));
    }
    by_key
}

#[tokio::test]
async fn concurrent_enqueuers_never_create_a_duplicate_and_get_the_waiting_id() {
    let db = migrated_db().await;
    const KEYS: usize = 5;
    const ROUNDS: usize = 40;
    // Eight connections race on the same five keys: half through the Rust
    // client, half through the SQL function.
    let mut tasks = Vec::new();
    for worker in 0..8 {
        let client = db.client().await;
        tasks.push(tokio::spawn(async move {
            let mut seen: Vec<(String, Enqueued)> = Vec::new();
            for round in 0..ROUNDS {
                let key = format!("k{}", (round + worker) % KEYS);
                let e = if worker % 2 == 0 {
                    enqueue_detailed(&client, &NewJob::new("t", json!({})).unique_key(&key))
                        .await
                        .unwrap()
                } else {
                    let r = client
                        .query_one(
                            "SELECT id, duplicate FROM pgwake.enqueue_unique('t', unique_key => $1)",
                            &[&key],
                        )
                        .await
                        .unwrap();
                    Enqueued {
                        id: r.get(0),
                        duplicate: r.get(1),
                    }
                };
                seen.push((key, e));
            }
            seen
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await.unwrap());
    }
    // Ledger: exactly one waiting job per key, every caller got its id, and
    // exactly one caller per key was told it was not a duplicate.
    let waiting = waiting_by_key(&db).await;
    assert_eq!(waiting.len(), KEYS, "{waiting:?}");
    for (key, ids) in &waiting {
        assert_eq!(ids.len(), 1, "key {key} has several waiting jobs: {ids:?}");
        let mine: Vec<&Enqueued> = results
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, e)| e)
            .collect();
        assert!(mine.iter().all(|e| e.id == ids[0]), "{key}: {mine:?}");
        assert_eq!(
            mine.iter().filter(|e| !e.duplicate).count(),
            1,
            "{key}: {mine:?}"
        );
    }
    let total: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(total, KEYS as i64);
}

#[tokio::test]
async fn a_plain_insert_of_a_duplicate_is_a_unique_violation_and_on_conflict_skips_it() {
    let db = migrated_db().await;
    let client = db.client().await;
    let first: i64 = client
        .query_one(
            "INSERT INTO pgwake.jobs (task, unique_key) VALUES ('t', 'report:7') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let err = client
        .execute(
            "INSERT INTO pgwake.jobs (task, unique_key) VALUES ('t', 'report:7')",
            &[],
        )
        .await
        .unwrap_err();
    let db_err = err.as_db_error().expect("a server error");
    assert_eq!(
        db_err.code(),
        &tokio_postgres::error::SqlState::UNIQUE_VIOLATION
    );
    assert_eq!(db_err.constraint(), Some("jobs_unique_key"));
    // The README's ON CONFLICT form.
    let n = client
        .execute(
            "INSERT INTO pgwake.jobs (task, unique_key) VALUES ('t', 'report:7')
             ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(n, 0);
    // pgwake.enqueue returns the waiting job's id.
    let again: i64 = client
        .query_one("SELECT pgwake.enqueue('t', unique_key => 'report:7')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(again, first);
    // Jobs without a key are never duplicates.
    let a: i64 = client
        .query_one("SELECT pgwake.enqueue('t')", &[])
        .await
        .unwrap()
        .get(0);
    let b: i64 = client
        .query_one("SELECT pgwake.enqueue('t')", &[])
        .await
        .unwrap()
        .get(0);
    assert_ne!(a, b);
    assert_eq!(waiting_by_key(&db).await["report:7"], vec![first]);
}

#[tokio::test]
async fn the_rust_client_flags_duplicates_within_a_batch_and_against_the_table() {
    let db = migrated_db().await;
    let client = db.client().await;
    let existing = enqueue_detailed(&client, &NewJob::new("t", json!({})).unique_key("a"))
        .await
        .unwrap();
    assert!(!existing.duplicate);
    let jobs = vec![
        NewJob::new("t", json!({"n": 1})),
        NewJob::new("t", json!({"n": 2})).unique_key("a"),
        NewJob::new("t", json!({"n": 3})).unique_key("b"),
        NewJob::new("t", json!({"n": 4})).unique_key("b"),
        NewJob::new("t", json!({"n": 5})).ordering_key("o"),
    ];
    let out = enqueue_many_detailed(&client, &jobs).await.unwrap();
    assert_eq!(out.len(), 5);
    assert!(!out[0].duplicate);
    assert_eq!(
        out[1],
        Enqueued {
            id: existing.id,
            duplicate: true
        }
    );
    assert!(!out[2].duplicate);
    assert_eq!(
        out[3],
        Enqueued {
            id: out[2].id,
            duplicate: true
        }
    );
    assert!(!out[4].duplicate);
    // Every returned id is a job whose payload is the one enqueued (or, for
    // a duplicate, the waiting job's).
    let rows = client
        .query("SELECT id, payload, ordering_key FROM pgwake.jobs", &[])
        .await
        .unwrap();
    let by_id: HashMap<i64, (serde_json::Value, Option<String>)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    assert_eq!(by_id.len(), 4, "{by_id:?}");
    assert_eq!(by_id[&out[0].id].0, json!({"n": 1}));
    assert_eq!(by_id[&out[2].id].0, json!({"n": 3}));
    assert_eq!(by_id[&out[4].id], (json!({"n": 5}), Some("o".to_string())));
    let distinct: HashSet<i64> = out.iter().map(|e| e.id).collect();
    assert_eq!(distinct.len(), 4);
}

#[tokio::test]
async fn the_cli_and_ndjson_print_the_waiting_id_for_a_duplicate() {
    let db = migrated_db().await;
    let url = db.url.clone();
    let first = run_pgwake(
        &[
            "enqueue",
            "--task",
            "t",
            "--unique-key",
            "u",
            "--ordering-key",
            "o",
        ],
        Some(&url),
    );
    assert!(first.status.success(), "{}", stderr_of(&first));
    let first_id: i64 = String::from_utf8_lossy(&first.stdout)
        .trim()
        .parse()
        .unwrap();
    let again = run_pgwake(&["enqueue", "--task", "t", "--unique-key", "u"], Some(&url));
    assert!(again.status.success(), "{}", stderr_of(&again));
    let again_id: i64 = String::from_utf8_lossy(&again.stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(again_id, first_id);
    assert!(
        stderr_of(&again).contains("duplicate"),
        "{}",
        stderr_of(&again)
    );

    let mut child = pgwake_cmd()
        .env("DATABASE_URL", &url)
        .args(["enqueue", "--ndjson"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin
            .write_all(
                b"{\"task\": \"t\", \"unique_key\": \"u\"}\n\
                  {\"task\": \"t\", \"unique_key\": \"v\", \"ordering_key\": \"o\"}\n\
                  {\"task\": \"t\", \"unique_key\": \"v\"}\n\
                  {\"task\": \"t\"}\n",
            )
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("enqueued 2 jobs") && stdout.contains("2 duplicates"),
        "{stdout}"
    );
    let stderr = stderr_of(&out);
    assert!(
        stderr.contains(&format!("job {first_id} already waits")),
        "{stderr}"
    );

    // Ledger: one waiting job per key; the keys were stored.
    let waiting = waiting_by_key(&db).await;
    assert_eq!(waiting["u"], vec![first_id]);
    assert_eq!(waiting["v"].len(), 1);
    let ordered: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE ordering_key = 'o'")
        .await;
    assert_eq!(ordered, 2);
    let total: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(total, 3);
}

#[tokio::test]
async fn a_leased_job_does_not_count_and_its_retry_yields_the_key_to_the_newer_job() {
    // Running in lease mode = in leased_jobs: a new job with the key may
    // wait meanwhile. When the running one fails, its retry goes back
    // without the key (the newer job keeps it): never two waiting jobs.
    let db = migrated_db().await;
    let client = db.client().await;
    let running = enqueue_detailed(&client, &NewJob::new("t", json!({})).unique_key("k"))
        .await
        .unwrap();
    let rows = claim_lease_all(&client, "w1").await;
    assert_eq!(rows.len(), 1);
    let token: i64 = rows[0].get(12);
    let newer = enqueue_detailed(&client, &NewJob::new("t", json!({})).unique_key("k"))
        .await
        .unwrap();
    assert!(!newer.duplicate);
    assert_ne!(newer.id, running.id);
    // The running job fails: back to the queue, without the key.
    let back = pgwake::internal::sql::Db::unnamed(&client)
        .query(
            &pgwake::internal::sql::LEASE_REQUEUE,
            &[
                &vec![token],
                &vec![1i32],
                &vec![Some("boom".to_string())],
                &vec![Some(0.0f64)],
            ],
        )
        .await
        .unwrap();
    assert_eq!(back.len(), 1);
    let keys: Vec<(i64, Option<String>)> = client
        .query("SELECT id, unique_key FROM pgwake.jobs ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        keys,
        vec![(running.id, None), (newer.id, Some("k".to_string()))]
    );
    // A dead job does not count either: bury the waiting one, enqueue again.
    client
        .query_one("SELECT pgwake.cancel($1)", &[&newer.id])
        .await
        .unwrap();
    let after_dead = enqueue_detailed(&client, &NewJob::new("t", json!({})).unique_key("k"))
        .await
        .unwrap();
    assert!(!after_dead.duplicate);
    let dead_key: Option<String> = client
        .query_one(
            "SELECT unique_key FROM pgwake.dead_jobs WHERE id = $1",
            &[&newer.id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dead_key.as_deref(), Some("k"));
    // `dead retry` of it: the waiting job keeps the key.
    let revived = run_pgwake(
        &["dead", "retry", "--id", &newer.id.to_string()],
        Some(&db.url),
    );
    assert!(revived.status.success(), "{}", stderr_of(&revived));
    let waiting = waiting_by_key(&db).await;
    assert_eq!(waiting["k"], vec![after_dead.id]);
}

#[tokio::test]
async fn in_tx_mode_a_duplicate_of_a_running_job_waits_for_its_transaction_only() {
    // A tx-mode job's row stays in pgwake.jobs, deleted by the claim
    // transaction, while it runs: the unique index makes an enqueue of the
    // same key wait for that transaction. It ends the wait: done → the new
    // job is inserted; failed (put back) → the new one is its duplicate.
    let db = migrated_db().await;
    let claimer = db.client().await;
    let producer = db.client().await;
    let first = enqueue_detailed(&producer, &NewJob::new("t", json!({})).unique_key("k"))
        .await
        .unwrap();
    claimer.batch_execute("BEGIN").await.unwrap();
    let claimed = claimer
        .query(
            "DELETE FROM pgwake.jobs WHERE id = $1 RETURNING id",
            &[&first.id],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let claimer_pid: i32 = claimer
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let pending = tokio::spawn(async move {
        enqueue_detailed(&producer, &NewJob::new("t", json!({})).unique_key("k"))
            .await
            .unwrap()
    });
    // The producer waits on the claim transaction (a lock on its xid).
    let watcher = db.client().await;
    eventually(
        "the producer to wait on the claim transaction",
        Duration::from_secs(30),
        || async {
            watcher
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event = 'transactionid'
                       AND $1 = ANY(pg_blocking_pids(pid))",
                    &[&claimer_pid],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                == 1
        },
    )
    .await;
    assert!(!pending.is_finished());
    claimer.batch_execute("COMMIT").await.unwrap();
    let second = pending.await.unwrap();
    assert!(!second.duplicate);
    assert_ne!(second.id, first.id);
    assert_eq!(waiting_by_key(&db).await["k"], vec![second.id]);
}

#[tokio::test]
async fn unique_running_counts_a_running_job_in_both_modes_without_waiting() {
    let db = migrated_db().await;
    let producer = db.client().await;
    let job = |key: &str| {
        NewJob::new("t", json!({}))
            .unique_key(key)
            .unique_running(true)
    };
    // Lease mode: the leased job is the duplicate.
    let leased = enqueue_detailed(&producer, &job("l")).await.unwrap();
    let rows = claim_lease_all(&producer, "w1").await;
    assert_eq!(rows.len(), 1);
    let again = enqueue_detailed(&producer, &job("l")).await.unwrap();
    assert_eq!(
        again,
        Enqueued {
            id: leased.id,
            duplicate: true
        }
    );
    // Without the option, a running job does not count.
    let plain = enqueue_detailed(&producer, &NewJob::new("t", json!({})).unique_key("l"))
        .await
        .unwrap();
    assert!(!plain.duplicate);

    // tx mode: the job's row is deleted by the open claim transaction; the
    // enqueue does not wait for it, the running job is the duplicate.
    let running = enqueue_detailed(&producer, &job("t")).await.unwrap();
    let claimer = db.client().await;
    claimer.batch_execute("BEGIN").await.unwrap();
    let claimed = claimer
        .query(
            "DELETE FROM pgwake.jobs WHERE id = $1 RETURNING id",
            &[&running.id],
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let cli = run_pgwake(
        &[
            "enqueue",
            "--task",
            "t",
            "--unique-key",
            "t",
            "--unique-running",
        ],
        Some(&db.url),
    );
    assert!(cli.status.success(), "{}", stderr_of(&cli));
    let cli_id: i64 = String::from_utf8_lossy(&cli.stdout).trim().parse().unwrap();
    assert_eq!(cli_id, running.id);
    assert!(stderr_of(&cli).contains("duplicate"));
    let sql: (i64, bool) = {
        let r = producer
            .query_one(
                "SELECT id, duplicate FROM pgwake.enqueue_unique('t', unique_key => 't', unique_running => true)",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(sql, (running.id, true));
    claimer.batch_execute("COMMIT").await.unwrap();
    // Done: the next enqueue is a new job.
    let after = enqueue_detailed(&producer, &job("t")).await.unwrap();
    assert!(!after.duplicate);
    // Ledger: one waiting job per key.
    let waiting = waiting_by_key(&db).await;
    assert_eq!(waiting["l"], vec![plain.id]);
    assert_eq!(waiting["t"], vec![after.id]);
    // `--unique-running` needs `--unique-key`.
    let bad = run_pgwake(
        &["enqueue", "--task", "t", "--unique-running"],
        Some(&db.url),
    );
    assert_eq!(bad.status.code(), Some(2), "{}", stderr_of(&bad));
}
