//! The plain claim statements walk a claim index in order, whatever the
//! table's statistics say. The case that broke them: a table analyzed (or
//! vacuumed) while empty, then a burst of jobs before autovacuum analyzes
//! it again, which is every fresh install and every `pgwake bench` run.
//! With no column statistics the planner estimates a queue's 50,000 rows at
//! a few dozen, and told a claim limit above that, it read the whole queue
//! and sorted it on every claim (35 ms against 0.5 ms per claim of 100).
//! A plan is a deterministic stand-in for claim speed.

mod common;

use common::*;
use pgwake::sql::{Sql, CLAIM_LEASE_ALL, CLAIM_LEASE_QUEUE, CLAIM_TX_ALL, CLAIM_TX_QUEUE};
use serde_json::Value;

/// Every node type of a JSON plan, depth first.
fn node_types(plan: &Value, out: &mut Vec<String>) {
    if let Some(t) = plan["Node Type"].as_str() {
        let on = plan["Relation Name"].as_str().unwrap_or("");
        out.push(format!("{t} {on}").trim().to_string());
    }
    if let Some(children) = plan["Plans"].as_array() {
        for c in children {
            node_types(c, out);
        }
    }
}

/// `PREPARE`d as the worker prepares it; the plan of one execution with
/// these arguments (SQL literals), inside a transaction rolled back.
async fn plan_of(client: &tokio_postgres::Client, sql: &Sql, args: &str) -> Vec<String> {
    let types: Vec<&str> = sql.params.iter().map(|t| t.name()).collect();
    client
        .batch_execute(&format!(
            "DEALLOCATE ALL; PREPARE claim({}) AS {}",
            types.join(", "),
            sql.text
        ))
        .await
        .unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    let plan: Value = client
        .query_one(&format!("EXPLAIN (FORMAT JSON) EXECUTE claim({args})"), &[])
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", sql.name))
        .get(0);
    client.batch_execute("ROLLBACK").await.unwrap();
    let mut nodes = Vec::new();
    node_types(&plan[0]["Plan"], &mut nodes);
    nodes
}

#[tokio::test]
async fn claims_walk_the_claim_index_after_a_burst_into_a_table_analyzed_empty() {
    let db = migrated_db().await;
    let client = db.client().await;
    // The state of a fresh install: analyzed while empty (no column
    // statistics, 0 pages), then a burst; autovacuum kept away so that it
    // cannot analyze the table under the test.
    client
        .batch_execute("ALTER TABLE pgwake.jobs SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    client
        .batch_execute("VACUUM ANALYZE pgwake.jobs")
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO pgwake.jobs (queue, task)
             SELECT 'default', 't' FROM generate_series(1, 50000)",
        )
        .await
        .unwrap();
    let stats: i64 = db
        .scalar("SELECT count(*) FROM pg_stats WHERE schemaname = 'pgwake' AND tablename = 'jobs'")
        .await;
    assert_eq!(stats, 0, "the table must have no column statistics");
    let mut bad = Vec::new();
    for limit in [1, 10, 100, 1000] {
        for (sql, args) in [
            (&CLAIM_TX_QUEUE, format!("{limit}, 'default', NULL, '{{}}'")),
            (&CLAIM_TX_ALL, format!("{limit}, '{{}}', NULL, '{{}}'")),
            (
                &CLAIM_LEASE_QUEUE,
                format!("{limit}, 'default', NULL, '{{}}', 'w', 30"),
            ),
            (
                &CLAIM_LEASE_ALL,
                format!("{limit}, '{{}}', NULL, '{{}}', 'w', 30"),
            ),
        ] {
            let nodes = plan_of(&client, sql, &args).await;
            let walks_index = nodes.iter().any(|n| n == "Index Scan jobs");
            let sorts = nodes.iter().any(|n| n.starts_with("Sort"));
            if sorts || !walks_index {
                bad.push(format!("{} at limit {limit}: {nodes:?}", sql.name));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "claims that read and sort the queue instead of walking the index:\n{}",
        bad.join("\n")
    );
}
