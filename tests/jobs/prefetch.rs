//! What a lease worker has prefetched follows the queue's settings: a
//! queue paused or limited after its jobs were buffered takes them back
//! (attempts refunded) instead of letting them start (issue 33, item 3).

use crate::common;

use std::time::Duration;

use common::*;
use pgwake::client::{enqueue, NewJob};

/// Five gated jobs on a one-slot lease worker with a buffer of four: the
/// first runs and holds the slot, four wait in the buffer. Then `restrict`
/// (run by an operator's session): the four go back, unstarted, attempt
/// refunded. Returns the database, the still closed gate and the worker.
async fn four_buffered_then(restrict: &str) -> (TestDb, Gate, ChaosWorker) {
    let db = migrated_db().await;
    create_run_ledger(&db).await;
    let gate = Gate::closed(&db).await;
    let client = db.client().await;
    for _ in 0..5 {
        enqueue(&client, &NewJob::new("gated", serde_json::json!({})))
            .await
            .unwrap();
    }
    let w = ChaosWorker::spawn(
        &db,
        &[
            "--lease",
            "--concurrency",
            "1",
            "--prefetch",
            "4",
            // Nothing starts while the first run holds the slot: no stall
            // hand-back either.
            "--prefetch-wait-ms",
            "3600000",
        ],
    );
    until_runs(&db, "the first run", Duration::from_secs(60), |r| {
        r.len() == 1
    })
    .await;
    let leased = async || -> i64 { db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await };
    wait_for("four jobs buffered", Duration::from_secs(60), async || {
        let n = leased().await;
        (n == 5).then_some(()).ok_or(format!("{n} leased"))
    })
    .await;
    client.batch_execute(restrict).await.unwrap();
    wait_for(
        "the buffered jobs back in the queue, attempts refunded",
        Duration::from_secs(60),
        async || {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM pgwake.leased_jobs),
                            (SELECT count(*) FROM pgwake.jobs WHERE attempts = 0)",
                    &[],
                )
                .await
                .unwrap();
            let (leased, back): (i64, i64) = (row.get(0), row.get(1));
            (leased == 1 && back == 4)
                .then_some(())
                .ok_or(format!("{leased} leased, {back} back"))
        },
    )
    .await;
    (db, gate, w)
}

#[tokio::test]
async fn a_pause_takes_back_what_workers_prefetched() {
    let (db, gate, w) = four_buffered_then("SELECT pgwake.pause_queue('default')").await;
    gate.open().await;
    // The running job ends; nothing else of the paused queue starts.
    wait_for(
        "the running job done",
        Duration::from_secs(60),
        async || {
            let n: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
            (n == 0).then_some(()).ok_or(format!("{n} leased"))
        },
    )
    .await;
    assert!(w.terminate().await.success());
    assert_eq!(
        ledger_runs(&db).await.len(),
        1,
        "only the run started before the pause"
    );
    let waiting: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    assert_eq!(waiting, 4, "the buffered jobs wait for the resume");
}

#[tokio::test]
async fn a_new_max_running_takes_back_what_workers_prefetched() {
    let (db, gate, w) =
        four_buffered_then("SELECT pgwake.set_queue_max_running('default', 1)").await;
    gate.open().await;
    // They run under the limit now, one at a time, each on its first
    // attempt.
    until_drained(&db).await;
    assert!(w.terminate().await.success());
    let runs = ledger_runs(&db).await;
    assert_eq!(runs.len(), 5, "{runs:?}");
    assert!(runs.iter().all(|r| r.1 == 1 && !r.3), "{runs:?}");
}
