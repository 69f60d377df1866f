//! A claim future dropped at every await point (after 0, 1, 2, … polls)
//! loses no job and leaves no pooled connection idle in a transaction.

use crate::common;

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use common::*;
use pgwake::{Worker, WorkerConfig};

/// Poll `fut` at most `polls` times, letting I/O progress between polls;
/// returns whether it completed.
async fn poll_n<F: Future>(fut: F, polls: usize) -> bool {
    let mut fut = pin!(fut);
    for _ in 0..polls {
        let done = std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
            Poll::Ready(_) => Poll::Ready(true),
            Poll::Pending => Poll::Ready(false),
        })
        .await;
        if done {
            return true;
        }
        // Give the connection tasks a moment to move bytes; this is the
        // point of the test (stop at each successive await), not a wait
        // for an event.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    false
}

#[tokio::test]
async fn tx_mode_a_claim_cancelled_at_every_await_point_loses_nothing() {
    claim_cancelled_at_every_await_point_loses_nothing(false).await;
}

/// A lease claim commits by itself: dropped after that, its jobs stay
/// leased (or run on their slots) until their leases expire and the rescuer
/// puts them back.
#[tokio::test]
async fn lease_mode_a_claim_cancelled_at_every_await_point_loses_nothing() {
    claim_cancelled_at_every_await_point_loses_nothing(true).await;
}

async fn claim_cancelled_at_every_await_point_loses_nothing(lease: bool) {
    let db = migrated_db().await;
    let ids = {
        let client = db.client().await;
        client
            .query(
                "INSERT INTO pgwake.jobs (task, max_attempts) SELECT 't', 1000 FROM generate_series(1, 40) RETURNING id",
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>(0))
            .collect::<Vec<_>>()
    };
    let ledger = Ledger::default();
    let worker = Worker::builder(db.config())
        .config(WorkerConfig {
            batch: 2,
            application_name: "pgwake-cancel".into(),
            lease_queues: if lease {
                vec!["default".into()]
            } else {
                vec![]
            },
            lease_duration: Duration::from_secs(1),
            ..test_config()
        })
        .handler("t", ok_handler(&ledger))
        .build()
        .unwrap();
    let admin = db.client().await;
    let mut completed = 0;
    let mut cancelled = 0;
    for polls in 0..60 {
        if poll_n(worker.claim_once(), polls).await {
            completed += 1;
        } else {
            cancelled += 1;
        }
        // No connection of ours may stay idle in a transaction: a cancelled
        // claim closes its connection, and the server ends that session.
        eventually("no pgwake session idle in transaction", Duration::from_secs(10), || {
            let admin = &admin;
            async move {
                let n: i64 = admin
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'pgwake-cancel%' AND state LIKE 'idle in transaction%'",
                        &[],
                    )
                    .await
                    .unwrap()
                    .get(0);
                n == 0
            }
        })
        .await;
    }
    assert!(
        cancelled > 0 && completed > 0,
        "both cases were exercised: {cancelled} cancelled, {completed} completed"
    );
    // Drain what is left with uncancelled claims; in lease mode, leases a
    // dropped claim left behind expire and are rescued first.
    let rescuer = pgwake::internal::rescuer::Rescuer::new(
        worker.pool().clone(),
        pgwake::internal::rescuer::RescuerConfig::every(Duration::from_secs(1)),
    );
    // Leases expire by the clock (1 s here): drain, rescue, check again.
    wait_for(
        "every lease rescued and run",
        Duration::from_secs(60),
        async || {
            while worker.claim_once().await.unwrap() > 0 {}
            let leased: i64 = db.scalar("SELECT count(*) FROM pgwake.leased_jobs").await;
            if leased == 0 {
                return Ok(());
            }
            rescuer.run_once().await.unwrap();
            Err(format!("{leased} leases left"))
        },
    )
    .await;
    let left: i64 = db.scalar("SELECT count(*) FROM pgwake.jobs").await;
    let dead: i64 = db.scalar("SELECT count(*) FROM pgwake.dead_jobs").await;
    assert_eq!((left, dead), (0, 0));
    let dupes = ledger.check(&ids);
    // A run cancelled after its handler started but before COMMIT ran again:
    // that is the at-least-once contract; list them.
    println!("jobs run more than once because their claim was cancelled before commit: {dupes:?}");
    assert!(
        dupes.len() <= cancelled,
        "more duplicates than cancelled claims"
    );
}
