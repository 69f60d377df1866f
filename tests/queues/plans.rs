//! The plain claims walk a claim index in order, whatever the table's
//! statistics say. The case that broke them: a table analyzed (or vacuumed)
//! while empty, then a burst of jobs before autovacuum analyzes it again,
//! which is every fresh install and every `pgwake bench` run. With no column
//! statistics the planner estimates a queue's 50,000 rows at a few dozen,
//! and a plan chosen on that estimate read the whole queue and sorted it on
//! every claim (35 ms against 0.5 ms per claim of 100).
//!
//! Since schema version 12 the claims are PL/pgSQL functions that plan their
//! query once per session, generically, with sorting off (migration 0012).
//! So the plan that matters is the one a session made first and keeps: it is
//! made here while the table is empty, and must still be the index walk
//! after the burst. EXPLAIN cannot see inside a function; `auto_explain`
//! (a module of every PostgreSQL server; `LOAD` needs a superuser, which the
//! test cluster's user is) sends each plan the call runs to this session as
//! a NOTICE. A plan is a deterministic stand-in for claim speed.

use crate::common;

use common::*;
use futures::StreamExt;
use pgwake::internal::sql::{
    Sql, CLAIM_LEASE_ALL, CLAIM_LEASE_QUEUE, CLAIM_TX_ALL, CLAIM_TX_QUEUE, READY_QUEUES,
};
use serde_json::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio_postgres::{AsyncMessage, Client, NoTls};

/// Every node of a JSON plan, depth first: its type, relation and index.
fn node_types(plan: &Value, out: &mut Vec<String>) {
    if let Some(t) = plan["Node Type"].as_str() {
        let on = plan["Relation Name"].as_str().unwrap_or("");
        let using = plan["Index Name"].as_str().unwrap_or("");
        out.push(format!("{t} {on} {using}").trim().to_string());
    }
    if let Some(children) = plan["Plans"].as_array() {
        for c in children {
            node_types(c, out);
        }
    }
}

/// A session that logs the plan of every statement it runs, nested ones
/// included, as a NOTICE, and the notices' texts.
async fn explaining_session(db: &TestDb) -> (Client, UnboundedReceiver<String>) {
    let (client, mut conn) = tokio_postgres::connect(&db.url, NoTls).await.unwrap();
    let (tx, rx) = unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            if let AsyncMessage::Notice(n) = m {
                let _ = tx.send(n.message().to_string());
            }
        }
    });
    client
        .batch_execute(
            "LOAD 'auto_explain';
             SET auto_explain.log_min_duration = 0;
             SET auto_explain.log_nested_statements = on;
             SET auto_explain.log_format = json;
             SET auto_explain.log_level = notice;
             SET client_min_messages = notice;",
        )
        .await
        .unwrap();
    (client, rx)
}

/// Run `sql` as the worker prepares it with these arguments (SQL literals),
/// inside a transaction rolled back; the node types of every plan it ran.
async fn plans_of(
    client: &Client,
    notices: &mut UnboundedReceiver<String>,
    sql: &Sql,
    args: &str,
) -> Vec<String> {
    let types: Vec<&str> = sql.params.iter().map(|t| t.name()).collect();
    client
        .batch_execute(&format!(
            "DEALLOCATE ALL; PREPARE claim({}) AS {}",
            types.join(", "),
            sql.text
        ))
        .await
        .unwrap();
    while notices.try_recv().is_ok() {}
    client.batch_execute("BEGIN").await.unwrap();
    client
        .batch_execute(&format!("EXECUTE claim({args})"))
        .await
        .unwrap_or_else(|e| panic!("{}: {e:?}", sql.name));
    client.batch_execute("ROLLBACK").await.unwrap();
    // The notices of a statement arrive before its result: all are here.
    let mut nodes = Vec::new();
    while let Ok(text) = notices.try_recv() {
        let Some(json) = text.split_once("plan:").map(|(_, j)| j) else {
            continue;
        };
        let plan: Value = serde_json::from_str(json.trim())
            .unwrap_or_else(|e| panic!("auto_explain's plan is not JSON ({e}): {json}"));
        node_types(&plan["Plan"], &mut nodes);
        if plan.get("JIT").is_some() {
            nodes.push("JIT".into());
        }
    }
    nodes
}

/// The plan nodes that read `pgwake.jobs`.
fn scans_of_jobs(nodes: &[String]) -> Vec<&String> {
    nodes
        .iter()
        .filter(|n| n.contains(" jobs") && n.contains("Scan"))
        .collect()
}

/// Whether a plan sorts or is compiled (JIT).
fn sorts_or_compiles(nodes: &[String]) -> bool {
    nodes.iter().any(|n| n.starts_with("Sort") || n == "JIT")
}

/// Which of the four plain claims, at these limits (and the ready-queues
/// read, below), ran a plan that does anything but this: walk its claim
/// index in order (`jobs_queue_ready_idx`
/// for one queue, `jobs_claim_idx` for all: both leave out held jobs), then delete the rows it locked
/// by their addresses (a TID scan). Found wrong before: a sort of the whole
/// queue, a sequential scan of it, the delete walking `jobs_queue_claim_idx`
/// for `id = ANY(…)` (a plan made on the empty table, where every index
/// costs the same), and a JIT compilation (hundreds of milliseconds per
/// claim: a disabled plan type's cost puts a plan above `jit_above_cost`).
async fn bad_plans(client: &Client, notices: &mut UnboundedReceiver<String>) -> Vec<String> {
    let mut bad = Vec::new();
    for limit in [1, 10, 100, 1000] {
        for (sql, args, index) in [
            (
                &CLAIM_TX_QUEUE,
                format!("{limit}, 'default', NULL, '{{}}'"),
                "jobs_queue_ready_idx",
            ),
            (
                &CLAIM_TX_ALL,
                format!("{limit}, '{{}}', NULL, '{{}}'"),
                "jobs_claim_idx",
            ),
            (
                &CLAIM_LEASE_QUEUE,
                format!("{limit}, 'default', NULL, '{{}}', 'w', 30, {limit}"),
                "jobs_queue_ready_idx",
            ),
            (
                &CLAIM_LEASE_ALL,
                format!("{limit}, '{{}}', NULL, '{{}}', 'w', 30, {limit}"),
                "jobs_claim_idx",
            ),
        ] {
            let nodes = plans_of(client, notices, sql, &args).await;
            let scans = scans_of_jobs(&nodes);
            let walk = format!("Index Scan jobs {index}");
            let good = scans.len() == 2
                && scans.iter().any(|n| **n == walk)
                && scans.iter().any(|n| *n == "Tid Scan jobs");
            if !good || sorts_or_compiles(&nodes) {
                bad.push(format!("{} at limit {limit}: {nodes:?}", sql.name));
            }
        }
    }
    // The fair claims' read of the ready queues (migration 0013): every read
    // of the jobs walks jobs_queue_ready_idx (the loose scan of the distinct
    // queues and each queue's first ready row), never jobs_claim_idx or
    // jobs_run_at_idx, which read every other queue's jobs too.
    for args in ["'{}', 100", "'{busy}', 1"] {
        let nodes = plans_of(client, notices, &READY_QUEUES, args).await;
        let scans = scans_of_jobs(&nodes);
        let good = !scans.is_empty()
            && scans.iter().all(|n| {
                *n == "Index Scan jobs jobs_queue_ready_idx"
                    || *n == "Index Only Scan jobs jobs_queue_ready_idx"
            });
        if !good || sorts_or_compiles(&nodes) {
            bad.push(format!("{} ({args}): {nodes:?}", READY_QUEUES.name));
        }
    }
    bad
}

#[tokio::test]
async fn claims_walk_the_claim_index_after_a_burst_into_a_table_analyzed_empty() {
    let db = migrated_db().await;
    let (client, mut notices) = explaining_session(&db).await;
    // The state of a fresh install: analyzed while empty (no column
    // statistics, 0 pages); autovacuum kept away so that it cannot analyze
    // the table under the test.
    client
        .batch_execute("ALTER TABLE pgwake.jobs SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    client
        .batch_execute("VACUUM ANALYZE pgwake.jobs")
        .await
        .unwrap();
    // A worker's first claims, on the empty table: each function makes the
    // plan this session keeps.
    let bad_empty = bad_plans(&client, &mut notices).await;
    // The burst, into a busy queue and the one the queue claims ask for.
    client
        .batch_execute(
            "INSERT INTO pgwake.jobs (queue, task)
             SELECT CASE WHEN i % 2 = 0 THEN 'default' ELSE 'busy' END, 't'
             FROM generate_series(1, 50000) i",
        )
        .await
        .unwrap();
    let stats: i64 = db
        .scalar("SELECT count(*) FROM pg_stats WHERE schemaname = 'pgwake' AND tablename = 'jobs'")
        .await;
    assert_eq!(stats, 0, "the table must have no column statistics");
    let bad_kept = bad_plans(&client, &mut notices).await;
    // A session that starts after the burst plans in that state.
    let (fresh, mut fresh_notices) = explaining_session(&db).await;
    let bad_fresh = bad_plans(&fresh, &mut fresh_notices).await;
    assert!(
        bad_empty.is_empty() && bad_kept.is_empty() && bad_fresh.is_empty(),
        "claims that read and sort the queue instead of walking the index:\n\
         planned on the empty table: {bad_empty:#?}\n\
         the same plans after the burst: {bad_kept:#?}\n\
         planned after the burst: {bad_fresh:#?}"
    );
}

/// The claim functions and the ready-queues read plan once per session,
/// generically (the reason for migrations 0012 and 0013), and without
/// sorting (what keeps that one plan an index walk). Neither PostgreSQL's
/// plan cache nor EXPLAIN shows a function's plan counts, so this checks the
/// settings each function runs with.
#[tokio::test]
async fn every_plain_claim_function_plans_generically_with_sorting_off() {
    let db = migrated_db().await;
    let client = db.client().await;
    let rows = client
        .query(
            "SELECT p.proname, coalesce(p.proconfig, '{}')
             FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
             WHERE n.nspname = 'pgwake' AND p.proname = ANY($1)
               -- not the SQL wrappers that keep the lease claims of workers
               -- older than migration 0024 working, nor claim_tx_all and
               -- claim_lease_all, wrappers of claim_tx_all_after and
               -- claim_lease_all_after (functions/claims.sql)
               AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')
             ORDER BY p.proname",
            &[&vec![
                "claim_lease_all",
                "claim_lease_all_after",
                "claim_lease_queue",
                "claim_tx_all",
                "claim_tx_all_after",
                "claim_tx_queue",
                "ready_queues",
            ]],
        )
        .await
        .unwrap();
    assert_eq!(
        rows.len(),
        5,
        "the four claim functions and ready_queues exist"
    );
    for row in rows {
        let name: String = row.get(0);
        let mut config: Vec<String> = row.get(1);
        config.sort();
        assert_eq!(
            config,
            [
                "enable_seqscan=off",
                "enable_sort=off",
                "jit=off",
                "plan_cache_mode=force_generic_plan"
            ],
            "{name}"
        );
    }
}
