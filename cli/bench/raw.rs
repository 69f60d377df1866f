//! The raw ceiling: the mode's own claim statement, autocommit, no handler,
//! in a tight loop on C connections until the queue is empty. What the
//! worker adds on top (transaction control, the attempt ledger, handler
//! dispatch, outcomes) shows as the gap between this and the burn-down.

use std::time::Instant;

use futures::future::try_join_all;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::Bench;
use pgwake::error::{Error, Result};

const RAW_APP: &str = "pgwake-bench-raw";

/// Drain the loaded `jobs` with `batch`-sized claims; returns jobs per second.
pub(crate) async fn drain(bench: &Bench<'_>, batch: usize, jobs: u64) -> Result<f64> {
    let limit = i64::try_from(batch).map_err(|_| Error::Config("--batch is too large".into()))?;
    let claim = bench.mode.raw_claim(limit);
    let mut clients = Vec::with_capacity(bench.plan.concurrency);
    for _ in 0..bench.plan.concurrency {
        let client = bench.db.connect(RAW_APP).await?;
        let stmt = client
            .prepare(claim.sql)
            .await
            .map_err(Error::db("bench: prepare the raw claim"))?;
        clients.push((client, stmt));
    }
    let params = claim.params();
    let started = Instant::now();
    let claimed = try_join_all(clients.iter().map(|(c, s)| claim_loop(c, s, &params))).await?;
    let elapsed = started.elapsed();
    let claimed: u64 = claimed.iter().sum();
    if claimed != jobs {
        return Err(super::aborted(format!(
            "the raw claim loop drained {claimed} of {jobs} jobs"
        )));
    }
    Ok(super::stats::rate(claimed as f64, elapsed))
}

/// Claim until a claim comes back empty; returns how many rows it claimed.
async fn claim_loop(
    client: &Client,
    stmt: &Statement,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64> {
    let mut n = 0u64;
    loop {
        let rows = client
            .query(stmt, params)
            .await
            .map_err(Error::db("bench: raw claim"))?;
        if rows.is_empty() {
            return Ok(n);
        }
        n += rows.len() as u64;
    }
}
