//! Many small queues keep their batching: a claim round fills its batch
//! across queues (each still taken in rotation, so no queue waits behind
//! another's backlog), instead of claiming one queue's single job per
//! round — 10,000 jobs in 10,000 queues drained 6.7× slower than in one.

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use pgwake::{async_trait, BoxError, Handler, Job, JobContext, Outcome};

/// Records the claim transaction each job ran in (tx mode).
struct Xid(Arc<Mutex<Vec<String>>>);

#[async_trait]
impl Handler for Xid {
    async fn handle(&self, _job: &Job, ctx: JobContext<'_>) -> Result<Outcome, BoxError> {
        let tx = ctx.transaction().await?.expect("tx mode");
        let xid: String = tx
            .query_one("SELECT pg_current_xact_id()::text", &[])
            .await?
            .get(0);
        self.0.lock().unwrap().push(xid);
        Ok(Outcome::Done)
    }
}

#[tokio::test]
async fn jobs_spread_over_many_queues_are_claimed_in_batches() {
    let db = migrated_db().await;
    let jobs = 40;
    db.client()
        .await
        .batch_execute(&format!(
            "INSERT INTO pgwake.jobs (task, queue) SELECT 't', 'small' || i FROM generate_series(1, {jobs}) i"
        ))
        .await
        .unwrap();
    let xids = Arc::new(Mutex::new(Vec::new()));
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            concurrency: 1,
            batch: 10,
            ..test_config()
        })
        .handler("t", Xid(xids.clone()))
        .build()
        .unwrap();
    let mut w = Running::start(worker);
    w.next_events(jobs, Duration::from_secs(60), |_| true).await;
    w.shutdown().await;
    let xids = xids.lock().unwrap().clone();
    assert_eq!(xids.len(), jobs);
    let batches: HashSet<&String> = xids.iter().collect();
    // One queue's job per round would take one transaction per job; the
    // batch grows 1, 2, 4, 8, 10 … as it runs fast.
    assert!(
        batches.len() <= jobs / 4,
        "{} claim transactions for {jobs} jobs in {jobs} queues",
        batches.len()
    );
}
