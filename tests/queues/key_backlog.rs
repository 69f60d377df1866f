//! A backlog on one ordering key costs a claim nothing (issue 21, item 9):
//! the jobs of a key that wait behind an earlier job of their key are not
//! in the claims' way, so a claim reads a bounded number of rows however
//! deep a blocked key's backlog is — counted, not timed (the rows the
//! claim's transaction fetched from `pgwake.jobs`, from
//! `pg_stat_xact_user_tables`). And the key still runs: its next job
//! becomes claimable when the one before it ends, however it ends, in both
//! delivery modes, with producers inserting while jobs end.

use crate::common;

use common::*;
use pgwake::internal::sql::{self, Db, Sql};
use tokio_postgres::types::ToSql;
use tokio_postgres::Client;

/// The backlog of the blocked key.
const BACKLOG: i32 = 20_000;
/// Most rows of `pgwake.jobs` one claim may read, whatever the backlog.
const BOUND: i64 = 100;

/// Rows of `pgwake.jobs` this transaction has read so far (index fetches
/// and sequential reads).
async fn rows_read(c: &Client) -> i64 {
    c.query_one(
        "SELECT (coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0))::int8
         FROM pg_stat_xact_user_tables WHERE relid = 'pgwake.jobs'::regclass",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

/// Run `claim` in a transaction of its own that is rolled back: the jobs it
/// claimed and the rows of `pgwake.jobs` it read.
async fn claim_and_count(
    c: &Client,
    claim: &Sql,
    params: &[&(dyn ToSql + Sync)],
) -> (usize, i64) {
    c.batch_execute("BEGIN").await.unwrap();
    let before = rows_read(c).await;
    let claimed = Db::unnamed(c).query(claim, params).await.unwrap().len();
    let read = rows_read(c).await - before;
    c.batch_execute("ROLLBACK").await.unwrap();
    (claimed, read)
}

async fn claims_do_not_read_a_blocked_keys_backlog(lease: bool) {
    let db = migrated_db().await;
    let runner = db.client().await;
    let claimer = db.client().await;
    // The claimer's session plans its claims while the table is nearly empty
    // (the claim functions keep a generic plan per session): the plan must
    // not depend on what the table held when it was made.
    runner
        .batch_execute("INSERT INTO pgwake.jobs (task) VALUES ('warm')")
        .await
        .unwrap();
    let none: Vec<String> = Vec::new();
    let any: Option<Vec<String>> = None;
    let queue = "default".to_string();
    let worker = "w".to_string();
    let lease_s = 60.0f64;
    let limit = 10i64;
    let all_tx: (&Sql, Vec<&(dyn ToSql + Sync)>) =
        (&sql::CLAIM_TX_ALL, vec![&limit, &none, &any, &none]);
    let queue_tx: (&Sql, Vec<&(dyn ToSql + Sync)>) =
        (&sql::CLAIM_TX_QUEUE, vec![&limit, &queue, &any, &none]);
    let all_lease: (&Sql, Vec<&(dyn ToSql + Sync)>) = (
        &sql::CLAIM_LEASE_ALL,
        vec![&limit, &none, &any, &none, &worker, &lease_s],
    );
    let queue_lease: (&Sql, Vec<&(dyn ToSql + Sync)>) = (
        &sql::CLAIM_LEASE_QUEUE,
        vec![&limit, &queue, &any, &none, &worker, &lease_s],
    );
    let claims = if lease {
        [all_lease, queue_lease]
    } else {
        [all_tx, queue_tx]
    };
    for (claim, params) in &claims {
        assert_eq!(claim_and_count(&claimer, claim, params).await.0, 1);
    }
    runner
        .batch_execute("DELETE FROM pgwake.jobs WHERE task = 'warm'")
        .await
        .unwrap();
    runner
        .execute(
            "INSERT INTO pgwake.jobs (task, ordering_key) SELECT 't', 'k' FROM generate_series(1, $1)",
            &[&BACKLOG],
        )
        .await
        .unwrap();
    runner.batch_execute("ANALYZE pgwake.jobs").await.unwrap();

    // The key's first job is ready and free: a claim takes it, reading a
    // bounded number of rows.
    for (claim, params) in &claims {
        let (claimed, read) = claim_and_count(&claimer, claim, params).await;
        assert_eq!(claimed, 1, "{}: the key's first job", claim.name);
        assert!(
            read < BOUND,
            "{}: a claim of the key's first job read {read} rows of a {BACKLOG}-job backlog",
            claim.name
        );
    }

    // The key's first job runs: every other job of the key is blocked, and a
    // claim finds nothing, reading a bounded number of rows.
    if lease {
        assert_eq!(claim_lease_all(&runner, "runner").await.len(), 1);
    } else {
        runner.batch_execute("BEGIN").await.unwrap();
        assert_eq!(claim_tx_all(&runner).await.len(), 1);
    }
    for (claim, params) in &claims {
        let (claimed, read) = claim_and_count(&claimer, claim, params).await;
        assert_eq!(claimed, 0, "{}: a job started beside its key's", claim.name);
        assert!(
            read < BOUND,
            "{}: a claim that found nothing read {read} rows of a {BACKLOG}-job blocked backlog",
            claim.name
        );
    }

    // The same through the claims of a queue with a running limit.
    let out = run_pgwake(
        &["queue", "set", "default", "--max-running", "100"],
        Some(&db.url),
    );
    assert!(out.status.success(), "{}", stderr_of(&out));
    let no_admissions: Option<i64> = None;
    let (claim, params): (&Sql, Vec<&(dyn ToSql + Sync)>) = if lease {
        (
            &sql::CLAIM_LEASE_LIMITED,
            vec![&limit, &queue, &any, &none, &worker, &lease_s, &no_admissions],
        )
    } else {
        (
            &sql::CLAIM_TX_LIMITED,
            vec![&limit, &queue, &any, &none, &no_admissions],
        )
    };
    let (claimed, read) = claim_and_count(&claimer, claim, &params).await;
    assert_eq!(claimed, 0, "{}: a job started beside its key's", claim.name);
    assert!(
        read < BOUND,
        "{}: a claim that found nothing read {read} rows of a {BACKLOG}-job blocked backlog",
        claim.name
    );
    if !lease {
        runner.batch_execute("ROLLBACK").await.unwrap();
    }
}

#[tokio::test]
async fn tx_mode_a_claim_reads_a_bounded_number_of_rows_whatever_a_blocked_keys_backlog() {
    claims_do_not_read_a_blocked_keys_backlog(false).await;
}

#[tokio::test]
async fn lease_mode_a_claim_reads_a_bounded_number_of_rows_whatever_a_blocked_keys_backlog() {
    claims_do_not_read_a_blocked_keys_backlog(true).await;
}
