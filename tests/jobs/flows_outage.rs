//! Flows through a database crash (issue 36, "Done means"): chains a → b →
//! c drained by two worker processes while the server is killed
//! (`pg_ctl restart -m immediate`: no shutdown, recovery on start) in the
//! middle of the releases. After it: every job ran and ended, no child
//! started before its parent's last run ended, every run of a child read
//! its parent's result (`JobContext::parent_results`), none is left held,
//! none died. (With the release triggers dropped and the rescuer's sweep
//! doing nothing, no child is ever released and the drain times out; with
//! the tx claim's write of results onto the edges skipped, the children
//! read `null`: checked.)

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use crate::common::*;

const CHAINS: usize = 60;

async fn releases_survive_a_database_crash(mode: &[&str]) {
    let (cluster, db) = private_cluster_db().await;
    create_run_ledger(&db).await;
    let client = db.client().await;
    client
        .batch_execute(
            "ALTER TABLE pgwake_runs ADD COLUMN ended_at timestamptz;
             CREATE TABLE pgwake_relay (job_id bigint, parent_id bigint, result jsonb)",
        )
        .await
        .unwrap();
    let mut chains = Vec::with_capacity(CHAINS);
    for _ in 0..CHAINS {
        let ids: serde_json::Value = client
            .query_one(
                r#"SELECT pgwake.flow('[{"name":"a","task":"relay"},
                                        {"name":"b","task":"relay","after":["a"]},
                                        {"name":"c","task":"relay","after":["b"]}]')"#,
                &[],
            )
            .await
            .unwrap()
            .get(0);
        chains.push([
            ids["a"].as_i64().unwrap(),
            ids["b"].as_i64().unwrap(),
            ids["c"].as_i64().unwrap(),
        ]);
    }
    drop(client);
    let mut args = mode.to_vec();
    args.extend(["--record-end", "--sleep-ms", "20", "--concurrency", "4"]);
    let first = ChaosWorker::spawn(&db, &args);
    let second = ChaosWorker::spawn(&db, &args);
    // Some parents have ended and released their children: the crash
    // lands among releases.
    until_runs(&db, "a third of the runs", Duration::from_secs(60), |r| {
        r.len() >= CHAINS
    })
    .await;
    let _cluster = tokio::task::spawn_blocking(move || {
        cluster.restart("immediate").unwrap();
        cluster
    })
    .await
    .unwrap();
    until_drained(&db).await;
    assert!(first.terminate().await.success());
    assert!(second.terminate().await.success());

    let client = db.client().await;
    let rows = client
        .query("SELECT job_id, at, ended_at FROM pgwake_runs", &[])
        .await
        .unwrap();
    let mut runs: HashMap<i64, Vec<(SystemTime, Option<SystemTime>)>> = HashMap::new();
    for r in &rows {
        runs.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    for [a, b, c] in &chains {
        for (parent, child) in [(a, b), (b, c)] {
            let parent_end = runs[parent]
                .iter()
                .filter_map(|r| r.1)
                .max()
                .unwrap_or_else(|| panic!("job {parent} never ended a run: {:?}", runs[parent]));
            let child_start = runs
                .get(child)
                .unwrap_or_else(|| panic!("child {child} never ran"))
                .iter()
                .map(|r| r.0)
                .min()
                .unwrap();
            assert!(
                child_start > parent_end,
                "child {child} started before its parent {parent}'s last run ended: {:?} / {:?}",
                runs[child],
                runs[parent]
            );
        }
    }
    // Every run of a child read its parent's result, written by the
    // statement that ended the parent.
    let relayed = client
        .query("SELECT job_id, parent_id, result FROM pgwake_relay", &[])
        .await
        .unwrap();
    let mut read: HashMap<i64, Vec<(i64, serde_json::Value)>> = HashMap::new();
    for r in &relayed {
        read.entry(r.get(0)).or_default().push((r.get(1), r.get(2)));
    }
    for [a, b, c] in &chains {
        for (parent, child) in [(a, b), (b, c)] {
            let got = read.get(child).cloned().unwrap_or_default();
            // A run cut by the crash may have read nothing yet.
            assert!(!got.is_empty(), "child {child} read no result");
            for (from, result) in got {
                assert_eq!(
                    (from, result),
                    (*parent, serde_json::json!({"from": parent})),
                    "child {child}"
                );
            }
        }
    }
    let (held, dead): (i64, i64) = {
        let r = client
            .query_one(
                "SELECT (SELECT count(*) FROM pgwake.jobs WHERE held), (SELECT count(*) FROM pgwake.dead_jobs)",
                &[],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!((held, dead), (0, 0));
}

#[tokio::test]
async fn tx_mode_releases_survive_a_database_crash() {
    releases_survive_a_database_crash(&[]).await;
}

#[tokio::test]
async fn lease_mode_releases_survive_a_database_crash() {
    releases_survive_a_database_crash(&["--lease", "--lease-ms", "1500"]).await;
}
