//! Flows at scale (issue 36, "Done means": fan-out and fan-in of thousands):
//! the statements that add parents and that release children find rows by
//! key, never by scanning `pgwake.jobs` or `pgwake.job_parents` whole. A
//! scan per child added, or per parent ended, is quadratic in one
//! transaction: enqueueing 10,000 children of one parent took 16 s, and
//! their release in the parent's commit more than a minute under load
//! (25 minutes in lease mode), because the plans these functions cached
//! while the tables were small (or the statistics a long transaction
//! cannot refresh) chose sequential scans. The sequential-scan counters of
//! the transaction (`pg_stat_xact_user_tables`) say whether any happened,
//! without timing anything.

use crate::common::*;

const CHILDREN: i64 = 300;

/// Sequential scans of pgwake.jobs and pgwake.job_parents by this
/// transaction so far.
async fn seq_scans(tx: &tokio_postgres::Transaction<'_>) -> (i64, i64) {
    let r = tx
        .query_one(
            "SELECT coalesce(sum(seq_scan) FILTER (WHERE relname = 'jobs'), 0)::int8,
                    coalesce(sum(seq_scan) FILTER (WHERE relname = 'job_parents'), 0)::int8
             FROM pg_stat_xact_user_tables WHERE schemaname = 'pgwake'",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

#[tokio::test]
async fn adding_many_children_and_releasing_them_scans_no_table() {
    let db = migrated_db().await;
    let mut c = db.client().await;
    let parent: i64 = db
        .scalar("SELECT pgwake.enqueue('p', '{}', run_at => now() + interval '1 hour')")
        .await;

    // Fan-out: the children, one call each, in one transaction.
    let tx = c.transaction().await.unwrap();
    let before = seq_scans(&tx).await;
    tx.execute(
        "SELECT count(pgwake.enqueue('c', '{}', after => ARRAY[$1::bigint])) FROM generate_series(1, $2::int8)",
        &[&parent, &CHILDREN],
    )
    .await
    .unwrap();
    let after = seq_scans(&tx).await;
    tx.commit().await.unwrap();
    assert_eq!(
        after, before,
        "sequential scans (jobs, job_parents) while adding {CHILDREN} children"
    );

    // The parent's end releases them all, at its commit (the deferred
    // trigger, run now with SET CONSTRAINTS ALL IMMEDIATE to be counted).
    let tx = c.transaction().await.unwrap();
    let before = seq_scans(&tx).await;
    tx.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[&parent])
        .await
        .unwrap();
    tx.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
        .await
        .unwrap();
    let after = seq_scans(&tx).await;
    let held: i64 = tx
        .query_one("SELECT count(*) FROM pgwake.jobs WHERE held", &[])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    assert_eq!(held, 0, "every child released");
    assert_eq!(
        after, before,
        "sequential scans (jobs, job_parents) while releasing {CHILDREN} children"
    );

    // Fan-in: one child over 100 of the released jobs as parents, which
    // then end in one transaction.
    let parents: Vec<i64> = c
        .query("SELECT id FROM pgwake.jobs ORDER BY id LIMIT 100", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let tx = c.transaction().await.unwrap();
    let before = seq_scans(&tx).await;
    tx.execute(
        "SELECT pgwake.enqueue('last', '{}', after => $1)",
        &[&parents],
    )
    .await
    .unwrap();
    let after = seq_scans(&tx).await;
    tx.commit().await.unwrap();
    assert_eq!(
        after, before,
        "sequential scans while adding a child of 100 parents"
    );
    let tx = c.transaction().await.unwrap();
    let before = seq_scans(&tx).await;
    for p in &parents {
        tx.execute("DELETE FROM pgwake.jobs WHERE id = $1", &[p])
            .await
            .unwrap();
    }
    tx.batch_execute("SET CONSTRAINTS ALL IMMEDIATE")
        .await
        .unwrap();
    let after = seq_scans(&tx).await;
    let held: i64 = tx
        .query_one("SELECT count(*) FROM pgwake.jobs WHERE held", &[])
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    assert_eq!(held, 0, "the child released by its last parent's end");
    assert_eq!(
        after, before,
        "sequential scans while 100 parents of one child end"
    );
}
