//! Fair keys (issue 24): within a fair-keys queue, ready jobs are taken in
//! rotation between limit keys, so one key's backlog cannot starve
//! another's. One key holds 50,000 ready jobs, twenty keys hold 5 each,
//! inserted after it: the 100 jobs of the small keys run while the big key
//! still holds most of its backlog, with three worker processes, in both
//! delivery modes. Counts, not timing: in plain claim order the small
//! keys' jobs (inserted last, same priority) would run after all 50,000 —
//! run with `--fair-keys` left out (`FAIR` false below) and the test
//! fails with no big-key job left.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

const LONG: Duration = Duration::from_secs(180);

/// Whether the test turns fair keys on: false shows the test fails
/// without the mechanism.
const FAIR: bool = true;

async fn small_keys_are_served_while_a_big_key_drains(extra: &[&str]) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let c = db.client().await;
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
         SELECT 'tenants', 'work', '{}', 'big' FROM generate_series(1, 50000)",
    )
    .await
    .unwrap();
    let small: Vec<i64> = c
        .query(
            "INSERT INTO pgwake.jobs (queue, task, payload, limit_key)
             SELECT 'tenants', 'work', '{}', 'small-' || k
             FROM generate_series(1, 20) k, generate_series(1, 5) n
             RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(small.len(), 100);
    if FAIR {
        let out = run_pgwake(&["queue", "set", "tenants", "--fair-keys"], Some(&db.url));
        assert!(out.status.success(), "{}", stderr_of(&out));
    }
    let workers: Vec<ChaosWorker> = (0..3)
        .map(|_| {
            let mut args = vec!["--sleep-ms", "0"];
            args.extend_from_slice(extra);
            ChaosWorker::spawn(&db, &args)
        })
        .collect();
    let want: HashSet<i64> = small.iter().copied().collect();
    until_runs(&db, "the small keys' jobs to run", LONG, |runs| {
        let ran: HashSet<i64> = runs.iter().map(|r| r.0).collect();
        want.is_subset(&ran)
    })
    .await;
    let big_left: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE limit_key = 'big'")
        .await;
    for w in workers {
        w.terminate().await;
    }
    assert!(
        big_left > 40_000,
        "the small keys waited for the big one: only {big_left} of its 50,000 jobs were left"
    );
    // Ledger: every small job ran, none twice at once, none is left.
    let runs = ledger_runs(&db).await;
    assert!(
        !runs.iter().any(|r| want.contains(&r.0) && r.3),
        "a job ran twice at once"
    );
    let small_left: i64 = db
        .scalar("SELECT count(*) FROM pgwake.jobs WHERE limit_key <> 'big'")
        .await;
    assert_eq!(small_left, 0);
    // `pgwake queue list` shows the setting.
    let list = pgwake::admin::queues::list(&c).await.unwrap();
    assert_eq!(
        list.iter()
            .find(|q| q.queue == "tenants")
            .map(|q| q.fair_keys),
        Some(FAIR)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn small_keys_are_served_while_a_big_key_drains_tx() {
    small_keys_are_served_while_a_big_key_drains(&[]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn small_keys_are_served_while_a_big_key_drains_lease() {
    small_keys_are_served_while_a_big_key_drains(&["--lease-handler"]).await;
}

/// Priorities still order the jobs within a key, and the rotation reaches
/// every key: one worker, one job per claim, three keys with two jobs each
/// (the second of each at a better priority) run key by key in rotation,
/// each key's better job first.
#[tokio::test(flavor = "multi_thread")]
async fn the_rotation_takes_keys_in_turn_and_priorities_within_a_key() {
    let db = migrated_db().await;
    let c = db.client().await;
    pgwake::admin::queues::set_fair_keys(&c, "q", true)
        .await
        .unwrap();
    // Rows with their expected run order: a1 b1 c1 then a2 b2 c2 (x1 has
    // the better priority but was inserted second).
    c.batch_execute(
        "INSERT INTO pgwake.jobs (queue, task, payload, limit_key, priority)
         SELECT 'q', 't', jsonb_build_object('name', k || p), k, p
         FROM (VALUES ('a'), ('b'), ('c')) keys(k), (VALUES (2), (1)) prios(p)
         ORDER BY p DESC, k",
    )
    .await
    .unwrap();
    let mut order = Vec::new();
    for _ in 0..6 {
        c.batch_execute("BEGIN").await.unwrap();
        let rows = c
            .query(
                "SELECT x.payload ->> 'name' FROM pgwake.jobs x
                 WHERE x.id IN (SELECT f.id FROM pgwake.fair_key_jobs('q', $1, 1, NULL, '{}') f)",
                &[&order.last().map(|n: &String| n[..1].to_string())],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        let name: String = rows[0].get(0);
        c.execute(
            "DELETE FROM pgwake.jobs WHERE payload ->> 'name' = $1",
            &[&name],
        )
        .await
        .unwrap();
        c.batch_execute("COMMIT").await.unwrap();
        order.push(name);
    }
    assert_eq!(order, ["a1", "b1", "c1", "a2", "b2", "c2"]);
}
