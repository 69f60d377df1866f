//! After 100,000 enqueue/complete cycles a plain VACUUM reclaims the dead
//! tuples, and a claim again touches only a handful of pages.

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::{Worker, WorkerConfig};

/// Pages a claim-sized index scan touches (EXPLAIN ANALYZE BUFFERS); a
/// deterministic stand-in for "claim speed" that no machine load can skew.
async fn claim_scan_buffers(client: &tokio_postgres::Client) -> i64 {
    let plan: serde_json::Value = client
        .query_one(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
             SELECT id FROM pgwake.jobs WHERE run_at <= now() AND queue <> ALL('{}'::text[])
             ORDER BY priority, run_at, id LIMIT 100",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let p = &plan[0]["Plan"];
    p["Shared Hit Blocks"].as_i64().unwrap_or(0) + p["Shared Read Blocks"].as_i64().unwrap_or(0)
}

#[tokio::test]
async fn after_100000_cycles_a_plain_vacuum_reclaims_dead_tuples_and_claims_stay_cheap() {
    let db = migrated_db().await;
    let client = db.client().await;
    // Autovacuum off for this table, so the test sees the churn itself.
    client
        .batch_execute("ALTER TABLE pgwake.jobs SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            concurrency: 4,
            batch: 100,
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    for _ in 0..10 {
        client
            .batch_execute(
                "INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 10000)",
            )
            .await
            .unwrap();
        w.next_events(10_000, Duration::from_secs(300), |e| e.outcome() == "done")
            .await;
    }
    w.shutdown().await;
    assert_eq!(ledger.runs().len(), 100_000);
    // 100 live rows to claim from, behind 100,000 dead ones.
    client
        .batch_execute("INSERT INTO pgwake.jobs (task) SELECT 't' FROM generate_series(1, 100)")
        .await
        .unwrap();
    client
        .batch_execute("SELECT pg_stat_force_next_flush()")
        .await
        .unwrap();
    let before = claim_scan_buffers(&client).await;
    client.batch_execute("VACUUM pgwake.jobs").await.unwrap();
    let after = claim_scan_buffers(&client).await;
    let dead_tuples: i64 = {
        client
            .batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .unwrap();
        db.scalar(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'pgwake.jobs'::regclass",
        )
        .await
    };
    let pages: i64 = db
        .scalar("SELECT pg_relation_size('pgwake.jobs') / 8192")
        .await;
    println!("claim scan: {before} pages touched before VACUUM, {after} after; {dead_tuples} dead tuples left; heap {pages} pages");
    assert_eq!(dead_tuples, 0, "VACUUM reclaimed every dead tuple");
    // 100 rows live in a few heap pages behind a couple of index pages.
    assert!(
        after <= 25,
        "a claim of 100 rows touches {after} pages after VACUUM"
    );
    assert!(
        after * 10 <= before,
        "VACUUM cut the pages a claim touches by 10x or more ({before} → {after})"
    );
}
