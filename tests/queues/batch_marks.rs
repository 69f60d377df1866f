//! The tx-mode crash check reads marks by job under pressure, so a held
//! vacuum horizon, which leaves every finished batch's deleted mark in
//! `pgwake.tx_batches`, does not make it slower (issue 35, item 1). Read
//! whole, it took 0.7 ms per claim after three pinned minutes at 1,500
//! jobs/s (scripts/bench-pinned-horizon.sh). Without pressure it is read
//! whole, pipelined with the claim, and marks get no GIN entry per job
//! (migration 0036): that entry cost the tx fast path a sixth of its
//! throughput. Pages touched, from EXPLAIN (ANALYZE, BUFFERS), stand in for
//! time: no machine load skews them.

use crate::common;

use common::*;

/// The statement a tx-mode claim marks its batch with, for `ids` (in a
/// transaction rolled back): the mark's token, the suspects it found, and
/// the pages it touched.
async fn mark(c: &mut tokio_postgres::Client, ids: &[i64]) -> (Option<i64>, Vec<i64>, i64) {
    let tx = c.transaction().await.unwrap();
    let xid: String = tx
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .unwrap()
        .get(0);
    let none: Option<Vec<String>> = None;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&xid, &ids, &"a-worker", &none, &none, &none];
    let text = pgwake::internal::sql::BATCH_MARK_BY_JOB.text;
    // First the mark itself, then the same again explained: the statement
    // is a function's, planned at its first call in a session (catalog
    // reads that are not the check's).
    let row = tx.query_one(text, &params).await.unwrap();
    let plan: serde_json::Value = tx
        .query_one(
            &format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {text}"),
            &params,
        )
        .await
        .unwrap()
        .get(0);
    tx.rollback().await.unwrap();
    let p = &plan[0]["Plan"];
    let pages = p["Shared Hit Blocks"].as_i64().unwrap_or(0)
        + p["Shared Read Blocks"].as_i64().unwrap_or(0);
    (row.get(0), row.get(1), pages)
}

#[tokio::test]
async fn the_crash_check_reads_only_the_marks_of_the_jobs_claimed_however_many_dead_marks_a_held_horizon_keeps(
) {
    let db = migrated_db().await;
    let mut c = db.client().await;
    c.batch_execute("ALTER TABLE pgwake.tx_batches SET (autovacuum_enabled = false)")
        .await
        .unwrap();
    // Two crashed batches: their claim transactions are over, their marks
    // stay; one marked before the worker saw the pressure, one after.
    mark_as_crashed_batch(&db, &[7, 8]).await;
    mark_as_crashed_batch(&db, &[17, 18]).await;
    c.batch_execute("UPDATE pgwake.tx_batches SET by_job = true WHERE 17 = ANY(job_ids)")
        .await
        .unwrap();
    // A long transaction elsewhere holds the horizon.
    let pin = connect_as(&db, "metabase").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    // 20,000 batches that reported: each mark deleted in its claim's
    // commit, and kept by the horizon (one statement per 1,000: the same
    // dead rows a worker leaves). The first 1,000 were marked before the
    // worker saw the pressure (read whole under it: a bounded number), the
    // rest under it, by job.
    for chunk in 0..20 {
        c.batch_execute(&format!(
            "INSERT INTO pgwake.tx_batches (xid, job_ids, worker_id, by_job)
             SELECT pg_current_xact_id(), ARRAY[g, g + 1000000], 'w', {1}
             FROM generate_series({0}, {0} + 999) AS g;
             DELETE FROM pgwake.tx_batches WHERE worker_id = 'w';",
            1000 + chunk * 1000,
            chunk > 0
        ))
        .await
        .unwrap();
    }
    let table_pages: i64 = db
        .scalar(
            "SELECT pg_relation_size('pgwake.tx_batches') / current_setting('block_size')::bigint",
        )
        .await;
    assert!(
        table_pages >= 100,
        "the dead marks fill {table_pages} pages (expected ≥ 100)"
    );

    // Fresh jobs: marked, nothing suspect, a handful of pages.
    let (token, suspects, pages) = mark(&mut c, &[5_000_001, 5_000_002, 5_000_003]).await;
    assert!(token.is_some(), "a batch without suspects is marked");
    assert!(suspects.is_empty(), "{suspects:?}");
    assert!(
        pages * 4 < table_pages,
        "the check read {pages} pages of a {table_pages}-page table of dead marks"
    );

    // Jobs that were claimed before (their marks dead): not suspects.
    let (token, suspects, _) = mark(&mut c, &[1500, 1_001_500]).await;
    assert!(token.is_some());
    assert!(suspects.is_empty(), "{suspects:?}");

    // A job of each crashed batch: suspects, and nothing is marked.
    let (token, suspects, pages) = mark(&mut c, &[5_000_004, 8, 18]).await;
    assert_eq!(token, None, "a batch with a suspect is not marked");
    assert_eq!(suspects, vec![8, 18]);
    assert!(
        pages * 4 < table_pages,
        "the check read {pages} pages of a {table_pages}-page table of dead marks"
    );

    // A job charged in tx_attempts (a crashed batch of one, adopted).
    c.batch_execute("INSERT INTO pgwake.tx_attempts (job_id, charged) VALUES (9, 1)")
        .await
        .unwrap();
    let (token, suspects, _) = mark(&mut c, &[9, 5_000_005]).await;
    assert_eq!(token, None);
    assert_eq!(suspects, vec![9]);
    pin.batch_execute("ROLLBACK").await.unwrap();
}

/// Writes down, for each job it runs, whether its batch's mark is `by_job`
/// (read on a connection of its own: the mark is committed before the
/// handlers start).
type Seen = std::sync::Arc<std::sync::Mutex<std::collections::HashMap<i64, &'static str>>>;

struct ReadsItsMark(std::sync::Arc<tokio_postgres::Client>, Seen);

#[pgwake::async_trait]
impl pgwake::Handler for ReadsItsMark {
    async fn handle(
        &self,
        job: &pgwake::Job,
        _ctx: pgwake::JobContext<'_>,
    ) -> Result<pgwake::Outcome, pgwake::BoxError> {
        let by_job: bool = self
            .0
            .query_one(
                "SELECT bool_or(by_job) FROM pgwake.tx_batches WHERE $1 = ANY(job_ids)",
                &[&job.id],
            )
            .await?
            .get(0);
        self.1
            .lock()
            .unwrap()
            .insert(job.id, if by_job { "by_job" } else { "whole" });
        Ok(pgwake::Outcome::Done)
    }
}

/// Without pressure a tx batch's mark gets no GIN entry per job (the check
/// reads every mark, pipelined with the claim); under pressure it is
/// marked by job. Fails with either path forced: marks by job without
/// pressure cost the tx fast path a sixth of its throughput (migration
/// 0036), and whole-table reads under a held horizon grow with every batch.
#[tokio::test]
async fn batches_are_marked_by_job_only_under_pressure() {
    let db = migrated_db().await;
    let c = db.client().await;
    c.batch_execute(
        "SELECT pgwake.set_pressure_thresholds(horizon_elevated_seconds => 1, horizon_critical_seconds => 3600)",
    )
    .await
    .unwrap();
    let seen = Seen::default();
    let reader = std::sync::Arc::new(db.client().await);
    let worker = pgwake::Worker::builder(db.config())
        .config(pgwake::WorkerConfig {
            sample_interval: Some(std::time::Duration::from_millis(100)),
            ..test_config()
        })
        .handler("work", ReadsItsMark(reader, seen.clone()))
        .build()
        .unwrap();
    let w = Running::start(worker);
    w.until_listening().await;
    let long = std::time::Duration::from_secs(60);
    let insert = async || -> i64 {
        c.query_one(
            "INSERT INTO pgwake.jobs (task) VALUES ('work') RETURNING id",
            &[],
        )
        .await
        .unwrap()
        .get(0)
    };
    let tag_of = |id: i64| seen.lock().unwrap().get(&id).copied();
    let calm = insert().await;
    wait_for("the job without pressure", long, async || {
        tag_of(calm).ok_or("not run".to_string())
    })
    .await;
    assert_eq!(tag_of(calm), Some("whole"));

    let pin = connect_as(&db, "metabase").await;
    pin.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1;")
        .await
        .unwrap();
    wait_for(
        "the worker's sampler to see the pressure",
        long,
        async || {
            let l: String = c
                .query_one("SELECT level FROM pgwake.pressure_state", &[])
                .await
                .unwrap()
                .get(0);
            (l == "elevated").then_some(()).ok_or(l)
        },
    )
    .await;
    let pressed = insert().await;
    wait_for("the job under pressure", long, async || {
        tag_of(pressed).ok_or("not run".to_string())
    })
    .await;
    assert_eq!(tag_of(pressed), Some("by_job"));
    pin.batch_execute("ROLLBACK").await.unwrap();
    w.shutdown().await;
}
